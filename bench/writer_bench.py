"""Writer throughput against the disk, side by side in one run (no engine needed).

Feeds DatasetWriter samples shaped like the engine's (K contiguous [seq, H] bf16 tensors) and
compares, on the same disk in the same run:
  disk      one large buffer written with write() + fsync (the ceiling)
  previous  the first writer's method: safetensors.torch.save() to bytes, sha256, write, fsync
  writer-Nt-MM  DatasetWriter with N writer threads and shards of M MiB (streamed, hashed
                as written), fed one contiguous [seq, H] tensor per layer as CaptureEngine does
Usage: python bench/writer_bench.py [--dir D] [--samples N] [--seq S] [--hidden H] [--layers K]
       [--variants THREADS:SHARD_MIB,...] [--json FILE]
"""

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from hsdump.store.manifest import Manifest  # noqa: E402
from hsdump.store.writer import DatasetWriter  # noqa: E402


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
        total += len(data)
        n += 1
        pending, size = {}, 0

    for sid, (ids, hs) in enumerate(samples):
        for j, h in enumerate(hs):
            pending[f"{sid}/hidden_states/{j}"] = h.clone()  # it copied each strided view
            size += h.numel() * 2
        pending[f"{sid}/input_ids"] = ids
        if size >= shard_bytes:
            flush()
    if pending:
        flush()
    return total / (time.time() - t)


def writer(d: Path, samples, shard_bytes: int, threads: int, k: int, h: int) -> float:
    manifest = Manifest.for_rows(
        model="bench", hidden_size=h, num_hidden_layers=k + 2, layers=range(1, k + 1)
    )
    w = DatasetWriter(str(d), manifest, shard_bytes=shard_bytes, threads=threads)
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
    ap.add_argument(
        "--variants",
        default="1:256,3:256,3:1024,6:256",
        help="DatasetWriter runs as THREADS:SHARD_MIB, comma separated",
    )
    a = ap.parse_args()
    root = Path(a.dir or tempfile.mkdtemp(prefix="hsdump-wb-"))
    root.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    rows = [
        torch.randn(a.seq, a.layers * a.hidden, generator=g).to(torch.bfloat16) for _ in range(4)
    ]
    # engine-shaped: CaptureEngine hands on one contiguous [seq, H] tensor per layer
    layered = [
        [r.view(a.seq, a.layers, a.hidden)[:, j, :].contiguous() for j in range(a.layers)]
        for r in rows
    ]

    def samples():
        for i in range(a.samples):
            yield torch.arange(a.seq), layered[i % 4]

    total = a.samples * a.seq * a.layers * a.hidden * 2
    shard = a.shard_mb << 20
    res = {"disk": disk_ceiling(root, min(total, 2 << 30))}
    runs = [("previous", lambda d: previous(d, samples(), shard))]
    for v in a.variants.split(","):
        th, mb = (int(x) for x in v.split(":"))
        runs.append(
            (
                f"writer-{th}t-{mb}M",
                lambda d, th=th, mb=mb: writer(d, samples(), mb << 20, th, a.layers, a.hidden),
            )
        )
    for name, fn in runs:
        d = root / name
        d.mkdir()
        res[name] = fn(d)
        shutil.rmtree(d)
    print(
        f"{a.samples} samples x {a.seq} tokens x {a.layers} layers x {a.hidden} (bf16), "
        f"{total / 1e9:.2f} GB, shards of {a.shard_mb} MiB, cpus={os.cpu_count()}"
    )
    print(f"{'mode':16s} {'MB/s':>8s} {'of disk':>8s}")
    for k, v in res.items():
        print(f"{k:16s} {v / 1e6:8.0f} {v / res['disk']:8.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({k: v / 1e6 for k, v in res.items()}, indent=1))
    if not a.dir:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
