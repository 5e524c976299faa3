"""Host memory of a capture run, itemised per process and per buffer (issue 15 item 5).

One CaptureEngine (the GPU preset: 16,384-token chunks) and a DatasetWriter with the default
writer settings (6 threads x 256 MiB shards), the 8B shape by default, `engine.inflight_tokens`
set as `extract.py` sets it under the default `output.max_host_bytes` for each sequence length
(pipeline.rows_in_flight). Every 0.1 s a sampler reads:
  - the RSS of this process (the caller) and of each SGLang process (scheduler, detokenizer);
  - in the caller: the bytes of captured rows the receiver holds (chunks not yet taken) and
    the writer's `host_bytes` (the shard filling, the one queued, those being written).
For each length the table gives, at the moment the summed RSS peaked, each process's growth
over its idle RSS (engine up, nothing submitted) and the caller's buffers, and what is left
unaccounted in the caller. The scheduler's host staging per forward is the packed rows of one
chunk (tokens x (slots x hidden + slots) x 2 bytes, hs.to("cpu")), printed as "expected".

    source .gpu/part1/install.sh || exit 1; export PYTHONPATH=.:$PYTHONPATH
    python3 bench/mem_bench.py --seqs 2048:256,32768:16 --json $OUT/mem-llama8b.json
    python3 bench/mem_bench.py --device cpu --seqs 256:32,2048:8     # a plumbing check here
    python3 bench/mem_bench.py --writer-only --seqs 8192:24,32768:12 --out-dir /tmp  # no engine
    python3 bench/mem_bench.py --caller-only --seqs 2048:64,32768:6 \
        --json bench/results/mem-caller-cpu.json        # the caller alone, itemised (7 min, CPU)

--caller-only (caller_run) explains the GPU run's unitemised caller growth at 32K (+2.22 GB
with receiver and writer both at 0): the sampler above counts Receiver.parts, which take()
pops before it stitches, so the chunks (one sample) and the stitched copy (one more) being
made are invisible to it; and CaptureEngine._drive's `done`/`task` locals keep the previous
sample's finished task, so its rows outlive the writer (one more sample) until the next
sample completes. The variants measure fixes for both, and glibc's share.

Those three fixes landed in hsdump in c7e2081 (docs/performance.md, "Host memory"): on today's code
"as-is" already has them, and the fix-* variants patch nothing (`_patched` finds the fix in
place); run them on an older checkout to see the difference. The --caller-only code (and the
Tracker both runs use) is in mem_caller.py beside this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import psutil
import torch
from mem_caller import CALLER_VARIANTS, Tracker, caller_only, caller_run, install_tracker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def proc_role(p: psutil.Process) -> str:
    try:
        name = " ".join(p.cmdline()[:1]) or p.name()
    except psutil.Error:
        return "gone"
    for role in ("scheduler", "detokenizer", "tokenizer", "data_parallel"):
        if role in name.lower():
            return role
    return "other:" + p.name()


class Sampler(threading.Thread):
    def __init__(self, eng, period: float = 0.1, tracker: "Optional[Tracker]" = None):
        super().__init__(name="mem-sampler", daemon=True)
        self.eng, self.writer, self.period, self.tracker = eng, None, period, tracker
        self.me = psutil.Process()
        self.samples: List[dict] = []
        self.stop_evt = threading.Event()

    def snapshot(self) -> dict:
        rss: Dict[str, int] = {"caller": self.me.memory_info().rss}
        for c in self.me.children(recursive=True):
            try:
                role = proc_role(c)
                rss[role] = rss.get(role, 0) + c.memory_info().rss
            except psutil.Error:
                pass
        rx = self.eng._rx
        with rx.cond:
            parts = [p for ps in rx.parts.values() for p in ps]
        recv = sum(t.numel() * t.element_size() for p in parts for t in p[1])
        w = self.writer
        # the Tracker's stages (install_tracker): chunks popped by take, its stitched copy,
        # a sample between take and add, written rows still referenced, bare frames
        c = self.tracker.counts() if self.tracker is not None else {}
        return {
            "t": time.time(),
            "rss": rss,
            "tree": sum(rss.values()),
            "receiver": recv,
            "writer": w.host_bytes if w is not None else 0,
            "tracked": {
                "chunks_in_take": max(c.get("chunk", 0) - recv, 0),
                **{k: c.get(k, 0) for k in ("stitch", "in_hand", "written", "frames_no_tensor")},
            },
        }

    def run(self):
        while not self.stop_evt.is_set():
            self.samples.append(self.snapshot())
            time.sleep(self.period)

    def take(self) -> List[dict]:
        out, self.samples = self.samples, []
        return out


def itemise(idle: dict, samples: List[dict], expected_staging: int) -> dict:
    peak = max(samples, key=lambda s: s["tree"])
    grow = {k: v - idle["rss"].get(k, 0) for k, v in peak["rss"].items()}
    tracked = peak.get("tracked", {})
    caller_known = peak["receiver"] + peak["writer"] + sum(tracked.values())
    return {
        "idle_rss": idle["rss"],
        "peak_rss": peak["rss"],
        "peak_tree": peak["tree"],
        "growth": grow,
        "at_peak": {"receiver": peak["receiver"], "writer": peak["writer"], **tracked},
        "caller_unaccounted": grow.get("caller", 0) - caller_known,
        "max": {
            "receiver": max(s["receiver"] for s in samples),
            "writer": max(s["writer"] for s in samples),
            "tree": peak["tree"],
            **{k: max(s.get("tracked", {}).get(k, 0) for s in samples) for k in tracked},
            **{f"rss_{k}": max(s["rss"].get(k, 0) for s in samples) for k in peak["rss"]},
        },
        "scheduler_expected_staging": expected_staging,
    }


def writer_only(a) -> int:
    """The writer's share alone, with no engine (runs on any machine): samples of rows at the
    model's width (constant values, so making them costs a memset) fed to a DatasetWriter as
    fast as it takes them; its host_bytes and this process's RSS sampled every 0.05 s."""
    from hsdump.store.manifest import Manifest
    from hsdump.store.writer import DatasetWriter

    if a.writer_module:  # another version of hsdump/store/writer.py, e.g. from `git show`
        import importlib.util

        spec = importlib.util.spec_from_file_location("hsdump.writer_other", a.writer_module)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        DatasetWriter = mod.DatasetWriter  # noqa: N806
    hidden, slots = a.hidden, 3
    me = psutil.Process()
    report = {"hidden": hidden, "slots": slots, "runs": []}
    for spec in a.writer_configs.split(","):
        threads, shard_mib = (int(x) for x in spec.split("x"))
        for seq, n in [tuple(int(x) for x in item.split(":")) for item in a.seqs.split(",")]:
            ds = tempfile.mkdtemp(prefix="hsdump-memw-", dir=a.out_dir)
            manifest = Manifest.for_rows(
                model="bench", hidden_size=hidden, num_hidden_layers=4, layers=[1, 2, 3]
            )
            w = DatasetWriter(
                os.path.join(ds, "d"), manifest, shard_bytes=shard_mib << 20, threads=threads
            )
            idle = me.memory_info().rss
            peak = {"rss": idle, "writer": 0}
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    peak["rss"] = max(peak["rss"], me.memory_info().rss)
                    peak["writer"] = max(peak["writer"], getattr(w, "host_bytes", 0))
                    time.sleep(0.05)

            th = threading.Thread(target=sample, daemon=True)
            th.start()
            t = time.time()
            for i in range(n):
                rows = [
                    torch.full((seq, hidden), float(i % 7 + j), dtype=torch.bfloat16)
                    for j in range(slots)
                ]
                w.add(i, [1] * seq, [1] * seq, rows, nonfinite=[])
                del rows
            w.close()
            stop.set()
            th.join()
            sample_bytes = seq * (slots * hidden * 2 + 16)
            r = {
                "threads": threads,
                "shard_mib": shard_mib,
                "seq": seq,
                "samples": n,
                "sample_bytes": sample_bytes,
                "wall_s": time.time() - t,
                "writer_module": a.writer_module,
                "writer_peak_host_bytes": getattr(w, "peak_host_bytes", None),
                "rss_idle": idle,
                "rss_growth_peak": peak["rss"] - idle,
                "bound": (threads + 2) * max(shard_mib << 20, sample_bytes),
                "shards": w.shards_written,
            }
            report["runs"].append(r)
            print(json.dumps(r), flush=True)
            shutil.rmtree(ds, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    print(
        "| writer | length | sample MB | shards | writer peak held GB | bound GB | RSS growth "
        "peak GB |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    for r in report["runs"]:
        print(
            f"| {r['threads']} x {r['shard_mib']} MiB | {r['seq']:,} | "
            f"{r['sample_bytes'] / 1e6:,.0f} | {r['shards']} | "
            f"{(r['writer_peak_host_bytes'] or 0) / 1e9:.2f} | {r['bound'] / 1e9:.2f} | "
            f"{r['rss_growth_peak'] / 1e9:.2f} |"
        )
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--model", default="llama8b")
    ap.add_argument("--weights", default="dummy", choices=("dummy", "files"))
    ap.add_argument("--models-dir", default="/tmp/hsdump-bench-models")
    ap.add_argument("--seqs", default="2048:256,32768:16", help="length:samples,...")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--writer-only",
        action="store_true",
        help="no engine: the DatasetWriter's share alone (see writer_only)",
    )
    ap.add_argument("--hidden", type=int, default=4096, help="--writer-only: row width")
    ap.add_argument(
        "--writer-module",
        default=None,
        help="--writer-only: measure this writer.py instead (an older version)",
    )
    ap.add_argument(
        "--writer-configs", default="6x256,3x1024", help="--writer-only: threads x shard MiB, ..."
    )
    ap.add_argument(
        "--caller-only",
        action="store_true",
        help="no engine: the caller's share, itemised (see caller_run)",
    )
    ap.add_argument(
        "--variants",
        default=",".join(CALLER_VARIANTS),
        help="--caller-only: " + "; ".join(f"{k}: {v}" for k, v in CALLER_VARIANTS.items()),
    )
    ap.add_argument(
        "--caller-run", default=None, choices=tuple(CALLER_VARIANTS), help=argparse.SUPPRESS
    )  # one variant, in this process
    ap.add_argument("--chunk", type=int, default=16384, help="--caller-only: prefill chunk")
    ap.add_argument(
        "--forward-s",
        type=float,
        default=2.5,
        help="--caller-only: seconds per full-chunk forward. 2.5 is slower than "
        "the H200 but puts this 2-core machine's writer ahead of the capture, "
        "the GPU run's regime (its writer never held two 32K samples)",
    )
    ap.add_argument(
        "--inflight-tokens",
        type=int,
        default=131072,
        help="--caller-only: engine.inflight_tokens (the GPU preset's)",
    )
    ap.add_argument("--period", type=float, default=0.02, help="--caller-only: sampler period")
    ap.add_argument("--trace", action="store_true", help="--caller-only: keep every read")
    a = ap.parse_args(argv)
    if a.writer_only:
        return writer_only(a)
    if a.caller_run:
        return caller_run(a)
    if a.caller_only:
        return caller_only(a)

    import bench
    from hsdump.capture.layers import read_model_info, resolve_layers
    from hsdump.config import OutputConfig
    from hsdump.pipeline import rows_in_flight
    from hsdump.store.writer import DatasetWriter

    bench._prepare(a.device)
    from hsdump.capture.base import Request
    from hsdump.capture.start import rows_manifest, start

    model = a.model if a.device == "cuda" else "tiny-llama"
    path = bench.build_model(model, f"{a.models_dir}/{model}", a.weights)
    info = read_model_info(path)
    layers = resolve_layers(None, None, info.num_hidden_layers)
    row_bytes = len(layers) * info.hidden_size * 2
    seqs = [tuple(int(x) for x in item.split(":")) for item in a.seqs.split(",")]
    out = OutputConfig(dir="x")
    ec = bench.engine_config(a.device, 0.5)
    if a.weights == "dummy" and a.device == "cuda":
        ec = dataclasses.replace(ec, extra={"load_format": "dummy"})
    out_dir = a.out_dir or tempfile.mkdtemp(prefix="hsdump-mem-")
    tracker = Tracker()
    install_tracker(tracker)  # before the engine's receiver starts
    t = time.time()
    eng = start(path, layers, ec, info=info)
    report = {
        "model": model,
        "layers": layers,
        "row_bytes_per_token": row_bytes,
        "engine_start_s": time.time() - t,
        "writer": {"threads": out.writer_threads, "shard_bytes": out.shard_bytes},
        "max_host_bytes": out.max_host_bytes,
        "runs": {},
    }
    g = torch.Generator().manual_seed(0)
    hi = min(info.vocab_size, 30000)
    sampler = Sampler(eng, tracker=tracker)
    sampler.start()
    chunk = ec.chunked_prefill_size if ec.chunked_prefill_size > 0 else ec.max_prefill_tokens
    base = 0
    try:
        # warm-up (JIT), then the idle baseline: engine up, nothing in flight
        eng.run(
            [
                Request(base + i, torch.randint(100, hi, (min(seqs)[0],), generator=g).tolist())
                for i in range(2)
            ],
            lambda s: None,
        )
        base += 2
        for seq, n in seqs:
            inflight = rows_in_flight(out, ec.inflight_tokens, seq, row_bytes)
            eng.cfg = dataclasses.replace(eng.cfg, inflight_tokens=inflight)
            samples = [torch.randint(100, hi, (seq,), generator=g).tolist() for _ in range(n)]
            time.sleep(0.5)
            sampler.take()
            idle = sampler.snapshot()
            ds = os.path.join(out_dir, f"ds-{seq}")
            shutil.rmtree(ds, ignore_errors=True)
            manifest = rows_manifest(path, layers, info)
            w = DatasetWriter(ds, manifest, shard_bytes=out.shard_bytes, threads=out.writer_threads)
            sampler.writer = w

            def sink(s):
                tracker.mark(s.layers, "writer")  # counted by the writer's host_bytes from here
                w.add_sample(s)

            t = time.time()
            eng.run([Request(base + i, s, [1] * len(s)) for i, s in enumerate(samples)], sink)
            w.close()
            wall = time.time() - t
            base += n
            sampler.writer = None
            got = sampler.take()
            staging = min(chunk, seq * n) * (len(layers) * info.hidden_size + len(layers)) * 2
            r = itemise(idle, got, staging)
            r.update(
                seq=seq,
                samples=n,
                tokens=seq * n,
                wall_s=wall,
                inflight_tokens=inflight,
                sample_bytes=seq * row_bytes,
                writer_peak_host_bytes=w.peak_host_bytes,
                writer_bound=(out.writer_threads + 2) * max(out.shard_bytes, seq * row_bytes),
                rows_in_flight_bound=inflight * row_bytes,
            )
            report["runs"][str(seq)] = r
            shutil.rmtree(ds, ignore_errors=True)
            print(
                json.dumps(
                    {
                        "seq": seq,
                        "peak_tree_gb": r["peak_tree"] / 1e9,
                        "growth_gb": {k: v / 1e9 for k, v in r["growth"].items()},
                        "at_peak_gb": {k: v / 1e9 for k, v in r["at_peak"].items()},
                        "caller_unaccounted_gb": r["caller_unaccounted"] / 1e9,
                    }
                ),
                flush=True,
            )
            if a.json:
                Path(a.json).write_text(json.dumps(report, indent=1))
    finally:
        sampler.stop_evt.set()
        eng.close()
    print(table(report))
    return 0


def table(report: dict) -> str:
    gb = lambda x: f"{x / 1e9:.2f}"  # noqa: E731
    rows = [
        "| length x samples | peak tree RSS | caller idle -> growth | receiver rows (at peak / max) "
        "| writer held (at peak / max; bound) | in take / in hand / written / bare frames "
        "(at peak) | caller unaccounted | scheduler idle -> growth "
        "(expected staging) | detokenizer growth | rows in flight bound |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seq, r in report["runs"].items():
        g, idle, ap, mx = r["growth"], r["idle_rss"], r["at_peak"], r["max"]
        rows.append(
            f"| {seq} x {r['samples']} | {gb(r['peak_tree'])} | {gb(idle.get('caller', 0))} -> "
            f"+{gb(g.get('caller', 0))} | {gb(ap['receiver'])} / {gb(mx['receiver'])} | "
            f"{gb(ap['writer'])} / {gb(mx['writer'])}; {gb(r['writer_bound'])} | "
            f"{gb(ap.get('chunks_in_take', 0) + ap.get('stitch', 0))} / "
            f"{gb(ap.get('in_hand', 0))} / {gb(ap.get('written', 0))} / "
            f"{gb(ap.get('frames_no_tensor', 0))} | "
            f"{gb(r['caller_unaccounted'])} | {gb(idle.get('scheduler', 0))} -> "
            f"+{gb(g.get('scheduler', 0))} ({gb(r['scheduler_expected_staging'])}) | "
            f"+{gb(g.get('detokenizer', 0))} | {gb(r['rows_in_flight_bound'])} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
