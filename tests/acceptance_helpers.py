"""For the tests of bench/acceptance/ (the acceptance pipeline as a package): its CLI run in
this process (`cli`: the pure logic, no SpecForge or SGLang) or as `python -m bench.acceptance`
from the repository root (`module`: anything that runs SpecForge's or SGLang's code)."""

import contextlib
import io
import os
import subprocess
import sys
import types

from factories import ROOT

if str(ROOT) not in sys.path:  # the package: `bench.acceptance` from the repository root
    sys.path.insert(0, str(ROOT))


def cli(*args, main=None) -> types.SimpleNamespace:
    """`python -m bench.acceptance ARGS` (or the CLI `main` given) in this process: its exit
    status, stdout and stderr as a subprocess's would be (a SystemExit with a message: 1, and
    the message on stderr)."""
    if main is None:
        from bench.acceptance.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                rc = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                rc = 1
    return types.SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


def module(*args, env=None, timeout=600, name="bench.acceptance") -> subprocess.CompletedProcess:
    """`python -m NAME ARGS` from the repository root (the package found there)."""
    return subprocess.run([sys.executable, "-m", name, *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)  # fmt: skip


def peer_env(*roots) -> dict:
    """This environment with the peers' unpacked wheels (SpecForge, accelerate) first on the
    path."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([*roots, os.environ.get("PYTHONPATH", "")]))
