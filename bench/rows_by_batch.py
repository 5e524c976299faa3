"""Does a sample's captured rows depend on what else the engine batches with it?

    python bench/rows_by_batch.py --out bench/results/rows-by-batch-cpu-tiny.json
    python bench/rows_by_batch.py --model smollm2_135m --samples 16 --max-len 512 \
        --out bench/results/rows-by-batch-cpu-smollm2.json

Captures the same samples with SGLang's CPU engine (a model preset, --model) several times:
twice one request at a time (engine.max_running_requests=1), and once with up to 16 requests
batched together (engine=cpu's default). For each capture and sample it compares every layer's
rows with the first one-at-a-time capture's: `equal` (bitwise) or the largest |difference|.
This is why a train-while-capturing run's losses can differ from an offline run's on another
capture of the same samples (docs/online.md): each epoch is captured again, in another order,
and the engine's kernels add up in an order that depends on the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def capture(out: Path, samples: int, max_len: int, running: int, model: str) -> None:
    env = dict(os.environ)
    env.pop("HSDUMP_FORBID_ENGINE", None)
    cmd = [sys.executable, "extract.py", "engine=cpu", f"model={model}",
           f"dataset.max_samples={samples}",
           f"dataset.max_seq_len={max_len}", f"engine.max_running_requests={running}",
           f"output.dir={out}", "progress=false"]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)}: rc {p.returncode}\n{p.stderr[-3000:]}")


def compare(ref: Path, other: Path) -> dict:
    import torch

    from hsdump.store.reader import HsdumpDataset

    a, b = HsdumpDataset(str(ref)), HsdumpDataset(str(other))
    rows = {}
    for sid in a.ids:
        x, y = a.get(sid), b.get(sid)
        assert torch.equal(x["input_ids"], y["input_ids"]), sid
        diffs = [
            (u.float() - v.float()).abs().max().item()
            for u, v in zip(x["hidden_states"], y["hidden_states"])
        ]
        rows[str(sid)] = dict(tokens=len(x["input_ids"]), max_abs_diff=max(diffs))
    return dict(
        samples=len(rows),
        equal=sum(r["max_abs_diff"] == 0 for r in rows.values()),
        max_abs_diff=max(r["max_abs_diff"] for r in rows.values()),
        rows=rows,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/hsdump-rows-by-batch")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--model", default="tiny", help="a conf/model preset")
    a = ap.parse_args(argv)
    work = Path(a.work)
    runs = {"one_at_a_time": 1, "one_at_a_time_again": 1, "batched_16": 16}
    for name, running in runs.items():
        capture(work / name, a.samples, a.max_len, running, a.model)
    ref = work / "one_at_a_time"
    from importlib.metadata import version

    result = dict(
        engine=f"SGLang {version('sglang')} on the CPU, bf16",
        model=a.model,
        question="a sample's rows, captured alone and batched with others",
        reference="one_at_a_time (engine.max_running_requests=1)",
        runs={
            n: dict(max_running_requests=r, **compare(ref, work / n))
            for n, r in runs.items()
            if n != "one_at_a_time"
        },  # fmt: skip
        command=f"python bench/rows_by_batch.py --model {a.model} --samples {a.samples} "
        f"--max-len {a.max_len} --out {a.out}",
    )
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    for n, r in result["runs"].items():
        print(f"{n}: {r['equal']} of {r['samples']} samples equal, max |diff| {r['max_abs_diff']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
