"""How much CPU an idle SGLang engine takes, with and without `sleep_on_idle`.

bench/acceptance's serve starts several engines together and times them one at a time while
the others wait idle. SGLang's idle scheduler polls its sockets without a pause unless
`sleep_on_idle` is set (its IdleSleeper). This measures that on SGLang's CPU engine: each
engine (SmolLM2-135M, built as `model=smollm2_135m` builds it) answers one request, then
sits idle for --idle-s seconds while the CPU time of its processes is read.

    python3 bench/idle_cpu.py --out bench/results/idle-cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(sleep: bool, idle_s: float) -> dict:
    """One engine in this process: its processes' CPU seconds per wall second while idle."""
    from hsdump.capture.patch import prepare_process

    prepare_process("cpu")
    import psutil
    from sglang.srt.entrypoints.engine import Engine

    from hsdump.tiny import resolve_model_path

    eng = Engine(model_path=resolve_model_path("smollm2:135m-instruct"), skip_tokenizer_init=True,
                 device="cpu", attention_backend="torch_native", disable_cuda_graph=True,
                 disable_radix_cache=True, max_total_tokens=20000, log_level="warning",
                 sleep_on_idle=sleep)  # fmt: skip
    try:
        eng.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 2})
        me = psutil.Process()
        procs = [me] + me.children(recursive=True)

        def cpu():
            return sum(sum(p.cpu_times()[:2]) for p in procs)

        c0, t0 = cpu(), time.perf_counter()
        time.sleep(idle_s)
        c1, t1 = cpu(), time.perf_counter()
    finally:
        eng.shutdown()
    return dict(sleep_on_idle=sleep, idle_s=round(t1 - t0, 2), processes=len(procs),
                cpu_s_per_s=round((c1 - c0) / (t1 - t0), 3))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--one", choices=["0", "1"], help=argparse.SUPPRESS)  # a child's run
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.one == "1", a.idle_s)), flush=True)
        return 0
    rows = []
    for flag in ("0", "1"):  # each engine in a process of its own
        cmd = [sys.executable, __file__, "--out", a.out, "--idle-s", str(a.idle_s), "--one", flag]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    import sglang

    out = dict(what="CPU seconds per second of an idle SGLang engine's processes",
               engine=f"SGLang {sglang.__version__}, CPU engine, SmolLM2-135M",
               machine=dict(cpus=__import__("os").cpu_count(), python=platform.python_version()),
               command=f"python3 bench/idle_cpu.py --out {a.out} --idle-s {a.idle_s:g}",
               rows=rows)  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
