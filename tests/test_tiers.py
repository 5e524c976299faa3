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


def test_a_file_runs_whole_on_one_worker_and_a_spread_file_test_by_test():
    """A real pytest-xdist run on two workers: each of two quick files ran whole on one worker
    (before 2026-12-02, pytest 9.2 + xdist 3.8's loadgroup split them test by test), and two
    tests of a SPREAD file (two quick ones that start no engine) ran on different workers: the first
    two units go to the two workers, which stock `--dist loadscope` (the file as one unit)
    would not do, so this fails if xdist does not use conftest's scheduler."""
    kinds = f"tests/{SPREAD[1]}"  # two of its quickest tests (under a second each)
    spread = [
        f"{kinds}::test_union_of_kinds_and_their_finals",
        f"{kinds}::test_serving_ids_per_rule",
    ]
    files = ["tests/test_boundary.py", "tests/test_dist.py"]
    args = ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope"]
    args += ["--no-loadscope-reorder", *spread, *files]
    rc, log = python(*args, timeout=300)
    assert rc == 0, log[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (tests/[\w/]+\.py::\w+)", log)
    where = {test: w for w, test in ran}
    assert set(spread) <= set(where), log[-3000:]
    assert where[spread[0]] != where[spread[1]], ran
    for f in files:
        workers = {w for test, w in where.items() if test.startswith(f + "::")}
        assert len(workers) == 1, (f, ran)


def test_first_names_files_that_exist():
    from factories import ROOT

    for name in FIRST + SPREAD:
        assert (ROOT / "tests" / name).is_file(), name
