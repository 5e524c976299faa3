"""The model families' tiny checkpoints (hsdump.testing.families: `FAMILIES`, `build`), and what
the tests do with them: `run_extract` runs extract.py on such a checkpoint and
`hf_hidden_states` is transformers' reference of it (tests/test_families.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from harness import extract

from hsdump.testing.families import (  # noqa: F401  (the tests' names for them)
    BOS,
    EOS,
    FAMILIES,
    Family,
    _stale,
    build,
    extract_overrides,
    families_dir,
)


# --------------------------------------------------------------------------- extract.py, reference
def run_extract(
    ckpt: Path,
    fam_name: str,
    layers,
    out_dir: Path,
    device: str,
    samples: int,
    timeout: float,
    log_path: Path,
    overrides=(),
) -> dict:
    """extract.py on a family's checkpoint (`capture.layers=layers`, `engine=device`) through
    tests/harness.py's `extract` (a clean environment, progress=false), leading a session of its
    own: after `timeout` seconds it is killed with its SGLang processes (the process group).
    Its command line and output go to `log_path`. Returns {"cmd", "rc", "timed_out",
    "seconds", "log"} (rc None on a timeout)."""
    args = extract_overrides(ckpt, fam_name, layers, device, samples)
    t0 = time.time()
    proc = extract(
        *overrides,
        out=out_dir,
        args=args,
        env={"PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1"},
        timeout=timeout,
        wait=False,
        new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        out = _kill_group(proc)
    cmd = [str(c) for c in proc.args]
    log = " ".join(cmd) + "\n\n" + (out or "")
    Path(log_path).write_text(log, errors="replace")
    return {
        "cmd": cmd,
        "rc": None if timed_out else proc.returncode,
        "timed_out": timed_out,
        "seconds": round(time.time() - t0, 1),
        "log": log,
    }


def _kill_group(proc: subprocess.Popen) -> str:
    """The run and every SGLang process it started (its own session), by process group id:
    SIGTERM, then SIGKILL after 15 s; its output, read to the end meanwhile (a full pipe
    cannot block the exit)."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.communicate(timeout=15)[0]
        except subprocess.TimeoutExpired:
            continue
    return proc.communicate()[0]


def hf_hidden_states(ckpt: Path, cls: str, prompts, dtype, device: str):
    """All of transformers' hidden_states (float32, CPU) per prompt, from the checkpoint's own
    class; a vision-language wrapper gets input_ids only (its text path): hsdump.check's
    reference, the one `hsdump check` runs."""
    from hsdump.check import hf_hidden_states as reference

    return reference(ckpt, prompts, dtype, device, cls=cls)
