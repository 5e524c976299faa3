"""`hsdump export --to speculators` at 1, 2, 4 and 8 workers on one dataset, with the disk's
synced write speed measured in the same run (one table).

    python bench/export_bench.py SRC [--workers 1,2,4,8] [--dd-mib 1024] [--json OUT.json]

SRC is an hsdump dataset (a dry one is fine: `extract.py engine=dry model=smollm2_135m
dataset=sharegpt_v3 dataset.max_samples=1000 'capture.layers=[2,15,27]'
'capture.final=[pre_norm]' output.dir=SRC`). Each export goes to a fresh folder beside SRC,
is timed from the first sample to the last fsync, and is deleted afterwards; page cache is
warm for SRC after the first run (run one warm-up with --warmup). Before 2026-12-01 the export
wrote one sample at a time (workers=1): 16.6 samples/s on the GPU host (bench/results/acceptance.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def synced_write_mib_s(folder: Path, mib: int) -> float:
    """MiB/s of writing `mib` MiB and fsyncing it (the disk's bound for any writer)."""
    path = folder / ".dd-probe"
    block = os.urandom(1 << 20)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    path.unlink()
    return mib / dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--dd-mib", type=int, default=1024)
    ap.add_argument("--warmup", action="store_true", help="one untimed export first")
    ap.add_argument("--json")
    a = ap.parse_args()
    from hsdump.tools.export import export

    src = Path(a.src).resolve()
    work = src.parent / f".{src.name}.export-bench"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    rows = []
    try:
        disk = synced_write_mib_s(work, a.dd_mib)
        if a.warmup:
            export(str(src), str(work / "warm"), "speculators", progress=False, allow_dry=True)
            shutil.rmtree(work / "warm")
        for w in [int(x) for x in a.workers.split(",")]:
            dest = work / f"w{w}"
            t0 = time.perf_counter()
            c = export(
                str(src), str(dest), "speculators", progress=False, allow_dry=True, workers=w
            )
            dt = time.perf_counter() - t0
            rows.append(
                dict(
                    workers=w,
                    samples=c["written"],
                    s=round(dt, 2),
                    samples_per_s=round(c["written"] / dt, 1),
                    mib_per_s=round(c["bytes"] / 2**20 / dt, 1),
                )
            )
            shutil.rmtree(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0]["samples_per_s"] if rows else 1.0
    print(f"disk, synced write of {a.dd_mib} MiB: {disk:,.0f} MiB/s ({os.cpu_count()} CPUs)")
    print(
        "| workers | samples | s | samples/s | MiB/s | x workers=" + str(rows[0]["workers"]) + " |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['workers']} | {r['samples']} | {r['s']} | {r['samples_per_s']} | "
            f"{r['mib_per_s']} | {r['samples_per_s'] / base:.2f} |"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps(dict(src=str(src), disk_mib_s=round(disk, 1), rows=rows), indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
