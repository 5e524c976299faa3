"""Run a bench script with `capture.allow_unverified=true` added to every `extract.py` it starts.

    python3 bench/gpu_stack/unverified.py bench/kimi_check.py --int4 ...

hsdump's family gate (hsdump.capture.families) accepts a class only on the SGLang versions it
was verified on; Kimi-K2.5 is recorded for 0.5.17 only, so on 0.5.23 `extract.py
model=kimi_k25` refuses before the engine starts, and bench/kimi_check.py (the check that would
verify it there) passes no override for it. This wrapper patches `subprocess.run` and
`subprocess.Popen` for the script it runs; the override is recorded in each dataset's manifest.
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
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
