"""Writer throughput against the disk, side by side in one run (no engine needed).

Feeds DatasetWriter samples shaped like the engine's (K views [seq, H] into one
[seq, K * H] buffer) and compares, on the same disk in the same run:
  disk      one large buffer written with write() + fsync (the ceiling)
  previous  the first writer's method: safetensors.torch.save() to bytes, sha256, write, fsync
  writer-N  DatasetWriter with N writer threads (streamed, hashed as written)
Usage: python bench/writer_bench.py [--dir D] [--samples N] [--seq S] [--hidden H] [--layers K]
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hsdump.writer import DatasetWriter  # noqa: E402


def disk_ceiling(d: Path, nbytes: int) -> float:
    buf = os.urandom(1 << 24) * max(1, nbytes >> 24)
    t = time.time()
    with open(d / "dd.bin", "wb", buffering=0) as f:
        f.write(buf)
        os.fsync(f.fileno())
    dt = time.time() - t
    os.unlink(d / "dd.bin")
    return len(buf) / dt


def previous(d: Path, samples, shard_bytes: int) -> float:
    from safetensors.torch import save

    t, total, pending, size, n = time.time(), 0, {}, 0, 0
    def flush():
        nonlocal pending, size, total, n
        data = save(pending, metadata={"format": "x"})
        hashlib.sha256(data).hexdigest()
        with open(d / f"s{n}.safetensors", "wb") as f:
            f.write(data)
            os.fsync(f.fileno())
        total += len(data); n += 1; pending, size = {}, 0
    for sid, (ids, hs) in enumerate(samples):
        for j, h in enumerate(hs):
            pending[f"{sid}/hidden_states/{j}"] = h.contiguous()
            size += h.numel() * 2
        pending[f"{sid}/input_ids"] = ids
        if size >= shard_bytes:
            flush()
    if pending:
        flush()
    return total / (time.time() - t)


def writer(d: Path, samples, shard_bytes: int, threads: int, k: int, h: int) -> float:
    w = DatasetWriter(str(d), {"layers": list(range(1, k + 1))}, {"k": 1},
                      layers=list(range(1, k + 1)), hidden_size=h, shard_bytes=shard_bytes,
                      threads=threads)
    t = time.time()
    for sid, (ids, hs) in enumerate(samples):
        w.add(sid, ids.tolist(), [1] * len(ids), hs)
    w.close()
    return w.bytes_written / (time.time() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--shard-mb", type=int, default=256)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    root = Path(a.dir or tempfile.mkdtemp(prefix="hsdump-wb-"))
    root.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(a.seq, a.layers * a.hidden, generator=g).to(torch.bfloat16)
            for _ in range(4)]
    def samples():  # engine-shaped: K strided views into one [seq, K * H] buffer
        for i in range(a.samples):
            r = rows[i % 4].view(a.seq, a.layers, a.hidden)
            yield torch.arange(a.seq), [r[:, j, :] for j in range(a.layers)]
    total = a.samples * a.seq * a.layers * a.hidden * 2
    shard = a.shard_mb << 20
    res = {"disk": disk_ceiling(root, min(total, 2 << 30))}
    for name, fn in [("previous", lambda d: previous(d, samples(), shard)),
                     ("writer-1", lambda d: writer(d, samples(), shard, 1, a.layers, a.hidden)),
                     ("writer-3", lambda d: writer(d, samples(), shard, 3, a.layers, a.hidden))]:
        d = root / name
        d.mkdir()
        res[name] = fn(d)
        shutil.rmtree(d)
    print(f"{a.samples} samples x {a.seq} tokens x {a.layers} layers x {a.hidden} (bf16), "
          f"{total / 1e9:.2f} GB, shards of {a.shard_mb} MiB, cpus={os.cpu_count()}")
    print(f"{'mode':10s} {'MB/s':>8s} {'of disk':>8s}")
    for k, v in res.items():
        print(f"{k:10s} {v / 1e6:8.0f} {v / res['disk']:8.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({k: v / 1e6 for k, v in res.items()}, indent=1))
    if not a.dir:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
