"""The test tiers' scheduling (tests/conftest.py): under `-n 2 --dist loadscope` a file runs
whole on one worker (its module fixtures are built once), a SPREAD file's tests are units of
their own, and the files of FIRST come first."""

import re

from conftest import FIRST, SPREAD, scope
from harness import python


def test_a_unit_is_a_file_except_in_the_spread_files():
    assert scope("tests/test_engine.py::test_rows[3]") == "tests/test_engine.py"
    assert scope("tests/test_engine.py::TestX::test_y") == "tests/test_engine.py"
    fam = f"tests/{SPREAD[0]}::test_family[llama]"
    assert scope(fam) == fam


def test_a_file_runs_whole_on_one_worker():
    """A real pytest-xdist run of two quick files on two workers: each file's tests all ran on
    one worker (before 2026-12-02, pytest 9.2 + xdist 3.8's loadgroup split them test by test)."""
    files = ["tests/test_boundary.py", "tests/test_dist.py"]
    args = ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope"]
    args += ["--no-loadscope-reorder", "-m", "not engine and not gpu", *files]
    rc, log = python(*args, timeout=300)
    assert rc == 0, log[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (tests/[\w/]+\.py)::", log)
    assert {f for _, f in ran} == set(files), log[-3000:]
    for f in files:
        assert len({w for w, g in ran if g == f}) == 1, (f, ran)


def test_first_names_files_that_exist():
    from factories import ROOT

    for name in FIRST + SPREAD:
        assert (ROOT / "tests" / name).is_file(), name
