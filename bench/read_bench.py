"""Read throughput of hsdump's loader, from the page cache and cold.

    python bench/read_bench.py --dir /tmp/hsdump_bench            # make (once) and measure
    python bench/read_bench.py --dir /tmp/hsdump_bench --fp8      # also an fp8 copy

Makes a dataset with hsdump's own DatasetWriter (random bf16 hidden states; default
64 samples x 2048 tokens x 3 layers x hidden 4096 = 50.3 MB/sample, 3.2 GB), then times:

  get            `ds.get(sid)` alone: header lookup + mmap, no data read (lazy)
  get+copy       `get` and a copy of every hidden state (what collating into a batch costs)
  loader         DataLoader(batch_size=4, collate_fn=PadCollator()), workers 0 and 2
  shuffled       get+copy in a random order
  raw read       plain sequential read() of the shard files: the device's ceiling

each "warm" (files in the page cache; a pass reads them in first) and "cold" (page cache
dropped with `sync; echo 3 > /proc/sys/vm/drop_caches` before the pass: needs root; without
it, posix_fadvise(POSIX_FADV_DONTNEED) on each shard, which drops that file's clean pages).
GB/s counts the bytes handed to the caller (hidden states in the dtype returned, ids, masks,
fp8 scales), 1 GB = 1e9 bytes. With --fp8, an fp8 copy is read as stored ("fp8raw",
dequantize=False) and dequantized to bf16 by the reader on the CPU ("fp8").
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

from hsdump.store import fp8  # noqa: E402
from hsdump.store.manifest import Manifest  # noqa: E402
from hsdump.store.reader import HsdumpDataset, PadCollator, read_safetensors_header  # noqa: E402
from hsdump.store.writer import DatasetWriter  # noqa: E402


def make(path: Path, samples: int, seq: int, hidden: int, k: int) -> None:
    if (path / "manifest.json").exists():
        ds = HsdumpDataset(str(path))
        if len(ds) == samples and ds.hidden_size == hidden and len(ds.layers) == k:
            return
        raise SystemExit(f"{path} holds another dataset; remove it or use another --dir")
    layers = list(range(2, 2 + k))
    manifest = Manifest.for_rows(
        model="bench",
        hidden_size=hidden,
        num_hidden_layers=k + 3,
        layers=layers,
        model_dtype="bfloat16",
    )
    w = DatasetWriter(str(path), manifest, shard_bytes=1 << 30)
    g = torch.Generator().manual_seed(0)
    t0 = time.time()
    for sid in range(samples):
        hs = [torch.randn(seq, hidden, generator=g, dtype=torch.bfloat16) for _ in range(k)]
        w.add(
            sid,
            torch.randint(0, 128000, (seq,), generator=g).tolist(),
            [0] * (seq // 4) + [1] * (seq - seq // 4),
            hs,
        )
    w.close()
    print(
        f"made {path}: {samples} samples, {w.bytes_written / 1e9:.2f} GB in "
        f"{time.time() - t0:.0f} s",
        flush=True,
    )


def shard_paths(path: Path):
    """The dataset's committed shard files (format version 2 keeps them in subfolders)."""
    from hsdump.store import commits

    return [path / name for name in sorted(commits.load(path).names)]


def make_fp8(src: Path, dst: Path) -> None:
    """An fp8 copy of `src`: the same shards with hidden states encoded by hsdump.store.fp8."""
    if (dst / "index.json").exists():
        return
    from safetensors import safe_open
    from safetensors.torch import save_file

    from hsdump.store import commits

    dst.mkdir(parents=True, exist_ok=True)
    c = commits.load(src)
    for k, name in enumerate(c.names):
        out = {}
        with safe_open(str(src / name), framework="pt") as f:
            shard_meta = f.metadata()
            for key in f.keys():
                t = f.get_tensor(key)
                out.update(fp8.encode(key, t) if "/hidden_states/" in key else {key: t})
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        save_file(out, str(dst / name), metadata={**shard_meta, **fp8.shard_metadata()})
        c.nbytes[k] = (dst / name).stat().st_size  # the copy's own sizes and checksums
        c.sha256[k] = hashlib.sha256((dst / name).read_bytes()).hexdigest()
    m = json.loads((src / "manifest.json").read_text())
    m["storage_dtype"] = fp8.STORAGE_NAME
    (dst / "manifest.json").write_text(json.dumps(m))
    c.covers = {}  # the copy has no logs: its index.json holds every record
    commits.write_index(dst, c)
    os.sync()
    print(f"made {dst}: {sum(c.nbytes) / 1e9:.2f} GB", flush=True)


def drop_caches(path: Path) -> str:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for p in shard_paths(path):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise_dontneed"


def sample_bytes(rec) -> int:
    n = rec["input_ids"].numel() * 16
    n += sum(s.numel() * 4 for s in rec.get("hidden_states_scale", []))
    return n + sum(h.numel() * h.element_size() for h in rec["hidden_states"])


def pass_get(ds, order, touch: bool):
    nbytes, t0 = 0, time.perf_counter()
    for sid in order:
        rec = ds.get(sid)
        if touch:
            for h in rec["hidden_states"]:
                h.clone()
            rec["input_ids"].clone(), rec["loss_mask"].clone()
            for sc in rec.get("hidden_states_scale", []):
                sc.clone()
        nbytes += sample_bytes(rec)
    return len(order), nbytes, time.perf_counter() - t0


def pass_loader(ds, workers: int):
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, collate_fn=PadCollator(), num_workers=workers
    )
    n, nbytes, t0 = 0, 0, time.perf_counter()
    for b in loader:
        n += len(b["ids"])
        nbytes += b["input_ids"].numel() * 16 + sum(
            h.numel() * h.element_size() for h in b["hidden_states"]
        )
    return n, nbytes, time.perf_counter() - t0


def pass_raw(path: Path):
    nbytes, t0 = 0, time.perf_counter()
    buf = bytearray(64 << 20)
    for p in shard_paths(path):
        with open(p, "rb", buffering=0) as f:
            while r := f.readinto(buf):
                nbytes += r
    return 0, nbytes, time.perf_counter() - t0


def rss():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("RssAnon", "RssFile")):
            out[line.split(":")[0]] = int(line.split()[1]) // 1024
    return out


def measure(path: Path, label: str, results: list, workers=(0, 2), only=None, **ds_kw) -> None:
    ds = HsdumpDataset(str(path), **ds_kw)
    ids = list(ds.ids)
    shuffled = ids[:]
    random.Random(0).shuffle(shuffled)
    passes = [
        ("get", lambda: pass_get(ds, ids, False)),
        ("get+copy", lambda: pass_get(ds, ids, True)),
        ("shuffled get+copy", lambda: pass_get(ds, shuffled, True)),
    ]
    passes += [(f"loader w{w}", (lambda w=w: pass_loader(ds, w))) for w in workers]
    passes += [("raw read", lambda: pass_raw(path))]
    if only:
        passes = [p for p in passes if p[0] in only]
    for cache in ("warm", "cold"):
        for name, fn in passes:
            ds.close()  # unmap: drop_caches keeps pages that a live mapping has touched
            gc.collect()
            if cache == "warm":
                pass_raw(path)  # bring every page in
                how = "page cache"
            else:
                how = drop_caches(path)
            n, nbytes, dt = fn()
            r = {
                "dataset": label,
                "cache": cache,
                "how": how,
                "pass": name,
                "samples": n,
                "seconds": round(dt, 3),
                "samples_per_s": round(n / dt, 1) if n else None,
                "GB_per_s": round(nbytes / dt / 1e9, 3),
            }
            results.append(r)
            print(
                f"{label:5s} {cache:4s} {name:18s} "
                + (f"{r['samples_per_s']:9.1f} samples/s " if n else " " * 20)
                + f"{r['GB_per_s']:7.3f} GB/s  ({dt:.2f} s, {how})",
                flush=True,
            )


def lazy_check(path: Path) -> dict:
    """get() of every sample without using it, from a dropped cache: how much process memory
    becomes resident (RssAnon: copies; RssFile: mapped pages) and how much the page cache
    grows (kernel readahead started by the first touched page of each tensor)."""
    drop_caches(path)
    ds = HsdumpDataset(str(path))
    before, c0 = rss(), page_cache_mib()
    t0 = time.perf_counter()
    recs = [ds.get(s) for s in ds.ids]
    dt = time.perf_counter() - t0
    mid, c1 = rss(), page_cache_mib()
    for r in recs[:4]:
        r["hidden_states"][0].float().sum()
    after = rss()
    held = sum(sample_bytes(r) for r in recs) / 2**20
    ds.close()
    return {
        "records_held_MiB": round(held),
        "get_all_seconds": round(dt, 2),
        "page_cache_growth_on_get_MiB": c1 - c0,
        "rss_before_MiB": before,
        "rss_after_get_all_MiB": mid,
        "rss_after_touching_4_tensors_MiB": after,
    }


def page_cache_mib() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("Cached:"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default="/tmp/hsdump_bench")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--fp8", action="store_true", help="also measure an fp8 copy")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args()
    base = Path(a.dir)
    bf16 = base / "bf16"
    make(bf16, a.samples, a.seq, a.hidden, a.layers)
    first = read_safetensors_header(shard_paths(bf16)[0])
    print(
        f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()}",
        flush=True,
    )
    results: list = []
    lazy = lazy_check(bf16)
    print("lazy:", lazy, flush=True)
    measure(bf16, "bf16", results)
    if a.fp8:
        make_fp8(bf16, base / "fp8")
        # as stored (dequantize=False: what a trainer that dequantizes on the GPU reads)
        measure(base / "fp8", "fp8raw", results, workers=(0,), dequantize=False)
        # dequantized to bf16 on the CPU by the reader (the default)
        measure(base / "fp8", "fp8", results, only=("get+copy",))
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "lazy": lazy,
                    "results": results,
                    "shape": [a.samples, a.seq, a.layers, a.hidden],
                    "metadata": first.get("__metadata__"),
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
