"""Run a Python script or module with `capture.allow_unverified=true` added to every `extract.py`
it starts.

    python3 tools/offline_host/unverified.py bench/families_probe.py --device gpu ...
    python3 tools/offline_host/unverified.py -m pytest -q tests/test_gpu_kimi.py

hsdump's family gate (hsdump.capture.families) accepts a class only on the SGLang versions it
was verified on, so on another release `extract.py` refuses the class before the engine
starts, and a check that would verify it there needs the override. This wrapper patches
`subprocess.run` and `subprocess.Popen` for what it runs; the override is recorded in each
dataset's manifest.
"""

import runpy
import subprocess
import sys

OVERRIDE = "capture.allow_unverified=true"


def _add(cmd):
    if isinstance(cmd, (list, tuple)) and any(str(c).endswith("extract.py") for c in cmd):
        if not any("allow_unverified" in str(c) for c in cmd):
            return list(cmd) + [OVERRIDE]
    return cmd


_run, _popen_init = subprocess.run, subprocess.Popen.__init__


def run(cmd, *a, **k):
    return _run(_add(cmd), *a, **k)


def popen_init(self, cmd, *a, **k):
    _popen_init(self, _add(cmd), *a, **k)


subprocess.run = run
subprocess.Popen.__init__ = popen_init

if __name__ == "__main__":
    if sys.argv[1:2] == ["-m"]:
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
