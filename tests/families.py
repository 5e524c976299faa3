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
    args = [
        f"model.path={ckpt}",
        f"model.tokenizer={ckpt}",
        f"model.name=probe-{fam_name}",
        "model.chat_template=deepseek_v3.jinja",
        "model.default_layers=null",
        f"capture.layers=[{','.join(map(str, layers))}]",
        "capture.allow_unverified=true",
        f"dataset.max_samples={samples}",
        "output.overwrite=true",
        f"engine={device}",
        "engine.log_level=info",
    ]
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
    class; a vision-language wrapper gets input_ids only (its text path)."""
    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        model = getattr(transformers, cls).from_pretrained(str(ckpt), dtype=dtype).to(device).eval()
        out = []
        for ids in prompts:
            res = model(
                input_ids=torch.tensor([ids], device=device),
                output_hidden_states=True,
                use_cache=False,
            )
            out.append([h[0].float().cpu() for h in res.hidden_states])
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out
