"""What a regenerated dataset's token_freq.json costs at the end of a job.

Every job's end checks whether the dataset is complete (`stats.uncommitted`: the index and
every job's log read, the source ids looked up); only the job that finds it complete counts it
(`stats.write_committed_token_freq`: every committed sample's ids and mask read back). Before
`count_if_complete` every job counted, so a J-job run read the whole dataset J times.

Writes N samples of 256 tokens (hidden 4, about 10 samples per shard) with DatasetWriter, times
both, and prints them with their projection to 1M samples:

    python3 bench/token_freq_scale.py 20000
"""

import argparse
import shutil
import tempfile
import time

import torch

from hsdump.store.manifest import Manifest
from hsdump.store.stats import uncommitted, write_committed_token_freq
from hsdump.store.writer import DatasetWriter


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("samples", type=int, nargs="?", default=20000)
    ap.add_argument("--jobs", type=int, default=64, help="jobs of the projected run")
    args = ap.parse_args(argv)
    n = args.samples
    d = tempfile.mkdtemp(prefix="hsdump-tf-")
    try:
        manifest = Manifest.for_rows(model="bench", hidden_size=4, num_hidden_layers=2, layers=[1])
        w = DatasetWriter(d, manifest, shard_bytes=30000)
        g = torch.Generator().manual_seed(0)
        t = time.time()
        for sid in range(n):
            ids = torch.randint(0, 30000, (256,), generator=g).tolist()
            w.add(sid, ids, [0] * 128 + [1] * 128, [torch.zeros(256, 4)])
        w.close(commit=True)
        write_s = time.time() - t
        t = time.time()
        left = uncommitted(d, range(n))
        check_s = time.time() - t
        assert left == 0, left
        t = time.time()
        write_committed_token_freq(d, 32000)
        count_s = time.time() - t
    finally:
        shutil.rmtree(d, ignore_errors=True)
    per = 1e6 / n
    print(f"{n:,} samples written in {write_s:.1f} s\n")
    print(
        "| step | per job end | us per sample | at 1M samples | "
        f"{args.jobs} jobs x 1M, all counting | {args.jobs} jobs x 1M, last counts |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| completeness check (every job) | {check_s:.2f} s | {check_s / n * 1e6:.1f} | "
        f"{check_s * per:.1f} s | - | {args.jobs * check_s * per:.0f} s |"
    )
    print(
        f"| recount (the completing job) | {count_s:.2f} s | {count_s / n * 1e6:.1f} | "
        f"{count_s * per:.1f} s | {args.jobs * count_s * per:.0f} s | {count_s * per:.0f} s |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
