"""Commit path at scale: write time per 1,000 samples at 10K, 100K and 1M samples (tiny
tensors, ~5 samples per shard as an 8B model at 2,048 tokens puts in a 256 MiB shard), with
the reader's open time and RSS, `verify --quick`, resume and `inspect` at each mark.

    python bench/scale.py write --samples 1000000 --out /tmp/scale          # the table
    python bench/scale.py write --samples 20000 --old                        # + version 1 path
    python bench/scale.py jobs --jobs 64 --samples 64000 --out /tmp/scale64  # many writers
    python bench/scale.py dirs --files 200000      # one folder of 200K files vs 1,000 per folder
    python bench/scale.py worker OUT NUM_JOBS JOB_INDEX SAMPLES              # one job (tests)

Each figure after the write is measured in a fresh process (RSS is that process's peak).
Results go to stdout as a table and to --json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from hsdump.dist import owns, writer_tag
from hsdump.store.manifest import Manifest

ROOT = Path(__file__).resolve().parents[1]

H, LAYERS, SEQ = 8, [1, 2, 3], 16
PER_SHARD = 5
SAMPLE_BYTES = 2 * SEQ * 8 + len(LAYERS) * SEQ * H * 2
MANIFEST = Manifest.for_rows(model="scale", hidden_size=H, num_hidden_layers=4, layers=LAYERS)


def tensors():
    g = torch.Generator().manual_seed(0)
    ids = list(range(SEQ))
    mask = [0] * (SEQ // 2) + [1] * (SEQ - SEQ // 2)
    hs = [torch.randn(SEQ, H, generator=g).to(torch.bfloat16) for _ in LAYERS]
    return ids, mask, hs


def open_writer(out, tag="", writer_cls=None, threads=6):
    """Today's DatasetWriter, or `writer_cls` (old_writer_cls: format version 1, which took the
    manifest as its JSON object and a resume key of its own)."""
    kw = dict(shard_bytes=PER_SHARD * SAMPLE_BYTES, writer_tag=tag, threads=threads)
    if writer_cls is None:
        from hsdump.store.writer import DatasetWriter

        return DatasetWriter(str(out), MANIFEST, **kw)
    old = MANIFEST.to_json()
    key = {"model": "scale", "layers": LAYERS}
    return writer_cls(str(out), old, key, layers=LAYERS, hidden_size=H, **kw)


def old_writer_cls():
    """The version 1 DatasetWriter (one index.json rewritten per commit), from git history,
    for the before/after columns of the same run."""
    src = subprocess.run(
        ["git", "show", "bcc40b1:hsdump/store/writer.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "hsdump_writer_v1.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("hsdump._writer_v1", path)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "hsdump"
    spec.loader.exec_module(mod)
    return mod.DatasetWriter


def probe(kind: str, out: str) -> dict:
    """One measurement in a fresh process: open time and peak RSS (VmHWM: ru_maxrss would
    carry this process's peak across fork and exec)."""
    code = {
        "reader": "from hsdump.store.reader import HsdumpDataset\nt=time.perf_counter()\n"
        "ds=HsdumpDataset(OUT)\nn=len(ds); ds.lengths; s=time.perf_counter()-t",
        "resume": "import bench.scale as b\nt=time.perf_counter()\nw=b.open_writer(OUT)\n"
        "n=len(w.done_ids()); w.close(commit=False); s=time.perf_counter()-t",
        "dist": "from hsdump.store.reader import HsdumpDataset\nfrom hsdump.dist import split\n"
        "t=time.perf_counter()\nds=HsdumpDataset(OUT)\np=split(ds.ids, 64)\n"
        "n=sum(map(len,p.values())); s=time.perf_counter()-t",
        "verify_quick": "from hsdump.tools.verify import verify\nt=time.perf_counter()\n"
        "r=verify(OUT, quick=True)\nassert r.ok, r.lines()[:5]\n"
        "n=r.samples_ok; s=time.perf_counter()-t",
        "inspect": "from hsdump.tools.inspect import gather\nt=time.perf_counter()\n"
        "f,_,_=gather(OUT)\nn=f['samples']; s=time.perf_counter()-t",
    }[kind]
    script = (
        "import resource, time, json, sys\nOUT=%r\n%s\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
        "print(json.dumps({'s': s, 'n': n, 'rss_mb': int(hwm.split()[1]) / 1024}))" % (out, code)
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        return {"error": r.stderr[-500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def write(args) -> dict:
    out = Path(args.out)
    marks = sorted({m for m in (10_000, 100_000, 1_000_000, args.samples) if m <= args.samples})
    ids, mask, hs = tensors()
    results = {
        "samples": args.samples,
        "per_shard": PER_SHARD,
        "sample_bytes": SAMPLE_BYTES,
        "rows": [],
    }
    variants = [("v2", None)] + ([("v1", old_writer_cls())] if args.old else [])
    for name, cls in variants:
        d = out / name
        shutil.rmtree(d, ignore_errors=True)
        w = open_writer(d, writer_cls=cls, threads=args.threads)
        t_prev = t0 = time.perf_counter()
        windows, sid = [], 0
        for mark in marks:
            while sid < mark:
                w.add(sid, ids, mask, hs)
                sid += 1
                if sid % 1000 == 0:
                    now = time.perf_counter()
                    windows.append(now - t_prev)
                    t_prev = now
                    if args.old and name == "v1" and now - t0 > args.old_budget_s:
                        break
            if sid < mark:
                break
            w.close()
            row = {
                "variant": name,
                "samples": mark,
                "wall_s": time.perf_counter() - t0,
                "first_1k_s": windows[0],
                "last_1k_s": windows[-1],
                "first_10k_per_1k_s": sum(windows[:10]) / len(windows[:10]),
                "last_10k_per_1k_s": sum(windows[-10:]) / len(windows[-10:]),
            }
            if name == "v2":
                for kind in args.probes.split(","):
                    row[kind] = probe(kind, str(d))
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
            if mark != marks[-1]:
                w = open_writer(d, writer_cls=cls, threads=args.threads)  # resume: go on
                t_prev = time.perf_counter()
        if sid < marks[-1]:
            results["rows"].append(
                {
                    "variant": name,
                    "samples": sid,
                    "stopped": True,
                    "wall_s": time.perf_counter() - t0,
                    "first_1k_s": windows[0],
                    "last_1k_s": windows[-1],
                    "last_10k_per_1k_s": sum(windows[-10:]) / 10,
                }
            )
            w.close()
        results[f"windows_{name}"] = windows
    return results


def worker(out: str, num_jobs: int, job: int, samples: int, threads: int = 2) -> int:
    """One job: commit the ids it owns among range(samples), resuming what is there."""
    ids, mask, hs = tensors()
    w = open_writer(out, writer_tag(num_jobs, job), threads=threads)
    done = w.done_ids()
    for sid in range(samples):
        if owns(sid, num_jobs, job) and sid not in done:
            w.add(sid, ids, mask, hs)
    w.close()
    return 0


def jobs(args) -> dict:
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "worker",
                str(out),
                str(args.jobs),
                str(j),
                str(args.samples),
            ],
            cwd=ROOT,
        )
        for j in range(args.jobs)
    ]
    rcs = [p.wait() for p in procs]
    wall = time.perf_counter() - t0
    # the commit phase alone: first to last shard on disk (the wall also holds 64 Python
    # and torch start-ups on however many cores there are)
    mt = [p.stat().st_mtime for p in (out / "shards").rglob("*.safetensors")]
    row = {
        "jobs": args.jobs,
        "samples": args.samples,
        "wall_s": wall,
        "samples_per_s": args.samples / wall,
        "failed_jobs": sum(1 for r in rcs if r),
        "shards": len(mt),
        "commit_window_s": max(mt) - min(mt),
        "commit_samples_per_s": args.samples / max(max(mt) - min(mt), 1e-9),
        "reader": probe("reader", str(out)),
        "verify_quick": probe("verify_quick", str(out)),
    }
    print(json.dumps(row), flush=True)
    return row


def dirs(args) -> dict:
    """One folder of N shard files against hsdump's 1,000 per folder: time to create them
    (write 4 KiB under a temporary name, rename: what a commit does to the folder; no fsync, so
    the folder's cost is what is timed), to open each by name in random order, and to list
    them, in the same run."""
    import random

    out, res = Path(args.out), {"files": args.files}
    for layout in ("flat", "nested"):
        d = out / layout
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        names = [
            f"{i // 1000:04d}/s-{i:06d}" if layout == "nested" else f"s-{i:06d}"
            for i in range(args.files)
        ]
        t = time.perf_counter()
        for n in names:
            p = d / n
            if layout == "nested" and n.endswith("000"):
                p.parent.mkdir(exist_ok=True)
            tmp = p.with_name(p.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(b"x" * 4096)
            os.replace(tmp, p)
        create = time.perf_counter() - t
        os.sync()
        random.Random(0).shuffle(names)
        t = time.perf_counter()
        for n in names:
            with open(d / n, "rb") as f:
                f.read(8)
        opened = time.perf_counter() - t
        t = time.perf_counter()
        listed = sum(len(fs) for _, _, fs in os.walk(d))
        walk = time.perf_counter() - t
        res[layout] = {"create_s": create, "open_s": opened, "walk_s": walk, "listed": listed}
        shutil.rmtree(d, ignore_errors=True)
        print(json.dumps({layout: res[layout]}), flush=True)
    return res


def table(res: dict) -> str:
    lines = [
        "| variant | samples | s per 1,000 (first 10K) | s per 1,000 (last 10K) | ratio | "
        "reader open s / RSS MB | resume s | dist 64 s | verify --quick s / RSS MB | "
        "inspect s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:

        def f(k, key="s"):
            v = r.get(k) or {}
            return "-" if key not in v else f"{v[key]:.2f}"

        first = r.get("first_10k_per_1k_s")
        ratio = r["last_10k_per_1k_s"] / first if first else float("nan")
        lines.append(
            f"| {r['variant']} | {r['samples']:,}{' (stopped)' if r.get('stopped') else ''} | "
            f"{first if first is None else round(first, 3)} | {r['last_10k_per_1k_s']:.3f} | "
            f"{ratio:.2f} | {f('reader')} / {f('reader', 'rss_mb')} | {f('resume')} | "
            f"{f('dist')} | {f('verify_quick')} / {f('verify_quick', 'rss_mb')} | "
            f"{f('inspect')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--samples", type=int, default=100_000)
    w.add_argument("--out", default="/tmp/hsdump-scale")
    w.add_argument("--threads", type=int, default=6)
    w.add_argument("--old", action="store_true", help="also the version 1 writer, same run")
    w.add_argument("--old-budget-s", type=float, default=300)
    w.add_argument("--probes", default="reader,resume,dist,inspect,verify_quick")
    w.add_argument("--json")
    j = sub.add_parser("jobs")
    j.add_argument("--jobs", type=int, default=64)
    j.add_argument("--samples", type=int, default=64_000)
    j.add_argument("--out", default="/tmp/hsdump-scale-jobs")
    j.add_argument("--json")
    dd = sub.add_parser("dirs")
    dd.add_argument("--files", type=int, default=200_000)
    dd.add_argument("--out", default="/tmp/hsdump-scale-dirs")
    dd.add_argument("--json")
    k = sub.add_parser("worker")
    for a in ("out", "num_jobs", "job", "samples"):
        k.add_argument(a)
    args = ap.parse_args(argv)
    if args.cmd == "worker":
        return worker(args.out, int(args.num_jobs), int(args.job), int(args.samples))
    res = {"write": write, "jobs": jobs, "dirs": dirs}[args.cmd](args)
    if args.cmd == "write":
        print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
