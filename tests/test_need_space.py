"""`make setup` stops before pip when the disk cannot hold the environment (tools/need_space.py)."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "need_space.py"


def run(folder, gb, **env):
    return subprocess.run([sys.executable, str(SCRIPT), str(folder), str(gb)], capture_output=True,
                          text=True, env={**os.environ, **env}, check=False)  # fmt: skip


def test_a_disk_too_small_stops_with_the_figures_and_the_fix(tmp_path):
    done = run(tmp_path / "not" / "made" / ".venv", 10**9)
    assert done.returncode == 2
    assert "GB free on the disk of" in done.stderr and "need about 1e+09 GB" in done.stderr
    assert "HSDUMP_MIN_FREE_GB" in done.stderr and "Free some space" in done.stderr


def test_enough_space_or_the_override_passes(tmp_path):
    assert run(tmp_path, 0).returncode == 0
    assert run(tmp_path, 10**9, HSDUMP_MIN_FREE_GB="0").returncode == 0


def test_the_makefile_checks_before_it_makes_the_environment():
    rule = (SCRIPT.parents[1] / "Makefile").read_text().split("$(STAMP):", 1)[1]
    assert rule.index("need_space.py") < rule.index("-m venv")
