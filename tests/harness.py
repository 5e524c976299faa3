"""The one way tests run hsdump in a subprocess: `extract.py` (`extract`), any Python script or
module (`python`), and the installed console script (`hsdump`). Every call starts from a clean
environment (no HSDUMP_FAULT, no HF_* or RAY_* settings leaking in from the caller), has a time
limit, and returns (returncode, stdout + stderr), or the running process when `wait=False`.

`DRY` is the override that puts a run on the dry engine (hsdump.capture.dry): tests of hsdump's
own bookkeeping (commits, kills, resume, signals, launchers, sweeps, jobs) use it; tests of
what SGLang decides leave it out and get the real CPU engine of the embedded default.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence, Union

from factories import ROOT

DRY = "engine=dry"
"""extract.py override: the dry engine (no SGLang)."""

_DROP = ("HSDUMP_FAULT", "HF_", "RAY_", "PYTEST_")


def clean_env(env: Optional[Dict[str, str]] = None, fault: Optional[str] = None) -> Dict[str, str]:
    """os.environ without hsdump's fault switch and the hub/Ray/pytest variables, plus `env`
    and, when given, HSDUMP_FAULT=fault (hsdump.store.files.fault)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(_DROP)}
    e.update(env or {})
    if fault:
        e["HSDUMP_FAULT"] = fault
    return e


def run(cmd, *, cwd, env, timeout, wait, new_session=False, split=False):
    """`cmd` (any program) with exactly `env`; (rc, output), (rc, out, err) if `split`, or the
    running process if not `wait`. The other helpers call this."""
    p = subprocess.Popen(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if split else subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=new_session,
    )
    if not wait:
        return p
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"timed out after {timeout} s: {cmd}\n{out[-4000:]}") from None
    return (p.returncode, out, err) if split else (p.returncode, out)


def python(
    *args,
    cwd: Union[str, Path] = ROOT,
    env: Optional[Dict[str, str]] = None,
    fault: Optional[str] = None,
    timeout: float = 600,
    wait: bool = True,
    new_session: bool = False,
):
    """`python ARGS` (this interpreter) from `cwd`."""
    return run(
        [sys.executable, *args],
        cwd=cwd,
        env=clean_env(env, fault),
        timeout=timeout,
        wait=wait,
        new_session=new_session,
    )


def extract(
    *overrides,
    out: Optional[Union[str, Path]] = None,
    args: Sequence[str] = (),
    cwd: Union[str, Path] = ROOT,
    env: Optional[Dict[str, str]] = None,
    fault: Optional[str] = None,
    timeout: float = 600,
    wait: bool = True,
    new_session: bool = False,
    multirun: bool = False,
):
    """`python extract.py [-m] [args] [output.dir=out] progress=false OVERRIDES` (the checkout's,
    from `cwd`). `args` come first: a test's shared overrides, which OVERRIDES may override.
    `new_session`: the run leads its own process group (os.killpg kills SGLang's children too)."""
    cmd = [str(ROOT / "extract.py"), *(["-m"] if multirun else []), "progress=false", *args]
    if out is not None:
        cmd.append(f"output.dir={out}")
    return python(
        *cmd,
        *overrides,
        cwd=cwd,
        env=env,
        fault=fault,
        timeout=timeout,
        wait=wait,
        new_session=new_session,
    )


def hsdump(
    *args,
    cwd: Union[str, Path, None] = None,
    env: Optional[Dict[str, str]] = None,
    timeout: float = 600,
    wait: bool = True,
    split: bool = False,
):
    """The installed console script (this environment's bin/hsdump), as a user runs it;
    `split`: (returncode, stdout, stderr)."""
    return run(
        [Path(sys.executable).parent / "hsdump", *args],
        cwd=cwd,
        env=clean_env(env),
        timeout=timeout,
        wait=wait,
        new_session=False,
        split=split,
    )
