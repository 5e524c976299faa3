"""Issue 24: output mistakes end in one line naming output.dir and the fix, with rc 2 and no
traceback, before anything is loaded; a single run leaves no Hydra folder in the current
folder; the space check prints sizes in units that fit."""

import errno
import logging
import os
import subprocess

import harness
import pytest

from hsdump import cli, pipeline
from hsdump.pipeline import check_output_dir, check_space
from hsdump.store.writer import WriteError


def extract(cwd, *overrides):
    """`python extract.py OVERRIDES` run from `cwd` (tests/harness.py): (rc, output)."""
    return harness.extract(*overrides, cwd=cwd, timeout=300)


def one_error(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out, out
    return lines[0]


def test_an_existing_file_is_refused_by_name_and_nothing_is_left(tmp_path):
    (tmp_path / "hs").write_text("x")
    rc, out = extract(tmp_path, f"output.dir={tmp_path / 'hs'}")
    line = one_error(out)
    assert rc == 2 and f"output.dir={tmp_path / 'hs'} is a file" in line
    assert "choose another output.dir" in line
    assert sorted(os.listdir(tmp_path)) == ["hs"]  # no outputs/.hydra, no extract.log


def test_a_path_that_cannot_be_created(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"output.dir=/proc/hs/x cannot be written \(in /proc\)"
        r": no folder can be created there; choose another",
    ):
        check_output_dir("/proc/hs/x")
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="cannot be created: .*/f is a file"):
        check_output_dir(str(tmp_path / "f" / "ds"))


def test_a_read_only_place(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        with pytest.raises(
            ValueError,
            match=r"output.dir=.*/ro/ds cannot be written \(in .*/ro"
            r"\): it is on a read-only file system",
        ):
            check_output_dir(str(ro / "ds"))
        rc, out = extract(tmp_path, f"output.dir={ro}")
        assert rc == 2 and "read-only file system" in one_error(out)
    finally:
        subprocess.run(["umount", "-l", str(ro)])


def test_a_writable_folder_passes_and_is_not_created(tmp_path):
    check_output_dir(str(tmp_path / "new" / "ds"))
    assert os.listdir(tmp_path) == []


def test_space_check_in_units_that_fit(monkeypatch, tmp_path):
    monkeypatch.setattr(
        pipeline.shutil, "disk_usage", lambda p: type("U", (), {"free": 700 * 1024})()
    )
    with pytest.raises(ValueError) as e:
        check_space(str(tmp_path / "ds"), 3 * 2**20, "raise")
    msg = str(e.value)
    assert "about 3.0 MiB to output.dir=" in msg and "only 700.0 KiB are free" in msg, msg
    check_space(str(tmp_path / "ds"), 3 * 2**20, "off")


@pytest.mark.parametrize(
    "error",
    [
        WriteError(
            "writing to output.dir=/d failed: [Errno 28] No space left on device. Samples "
            "committed before are intact; fix the cause (e.g. free disk space) and run the "
            "same command again to resume."
        ),
        OSError(errno.ENOSPC, "No space left on device", "/d/token_freq.json"),
        OSError(errno.EROFS, "Read-only file system", "/d/manifest.json"),
    ],
)
def test_write_errors_of_a_run_are_one_line_with_rc_2(monkeypatch, caplog, error):
    """A disk that fills (space_check=off) or turns read-only during the run: the message
    names output.dir, says committed samples stay, and the run exits 2 without a traceback."""
    from omegaconf import OmegaConf

    def failing(cfg, resolved_config=None):
        raise error

    monkeypatch.setattr(pipeline, "run", failing)
    monkeypatch.setattr("hsdump.config.to_config", lambda cfg: cfg)
    cfg = OmegaConf.create({"output": {"dir": "/d"}})
    with caplog.at_level(logging.ERROR, logger="hsdump"), pytest.raises(SystemExit) as e:
        cli.extract_job(cfg)
    assert e.value.code == 2
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "output.dir=/d" in msg and "intact" in msg and "run the same command again" in msg


def test_an_error_elsewhere_is_not_blamed_on_output_dir():
    e = OSError(errno.EACCES, "Permission denied", "/data/chats.jsonl")
    assert pipeline.output_error(e, "/d") == str(e)
