"""Capture throughput of serving layouts on two GPUs: TP 2, TP 2 + DP attention, TP 2 + EP 2.

Per layout, hsdump's engine (hsdump.capture.start, conf/engine/gpu.yaml with 16,384-token
chunks, or `layout@chunk`, e.g. `tp2-dpattn@32768`: SGLang divides the chunk by dp_size under DP
attention), 2,048-token random prompts, rows dropped by the sink (capture only: the small MoE's
rows outrun the disk, which would hide the layouts' differences); one warm-up pass, then timed
passes. `--model dsv3-small` (default: hsdump.testing.models' DeepSeek-V3 with real MLA dims,
hidden 512, 6 layers, random weights; layers [1, 3, 4]) or `kimi-width` (hidden 7168,
Kimi-K2.5's MLA and expert dims, 8 layers, 16 experts top-8; SGLang's dummy weights; layers
[3, 5, 6]: the Kimi-K2.5 preset's [3, 31, 59] of 61 as [3, L // 2 + 1, L - 2]). Whether the layouts'
rows are right is tests/test_gpu_layouts.py's.

    python3 bench/layouts_bench.py --model kimi-width --layouts tp2,tp2-ep2,tp2-dpattn,tp2-dpattn@32768 \
        --prompts 384 --repeat 4 --out $OUT/gpu-layouts-throughput-kimi-x2.json
    python3 bench/layouts_bench.py --layouts tp2-dpattn --auto-port --out $OUT/autoport.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from typing import List, Optional

LAYOUTS = {  # layout -> (tp, sglang.Engine extras)
    "tp1": (1, {}),
    "tp2": (2, {}),
    "tp2-dpattn": (2, {"dp_size": 2, "enable_dp_attention": True}),
    "tp2-ep2": (2, {"ep_size": 2}),
}
MODELS = ("dsv3-small", "kimi-width")


def split_layout(spec: str):
    """'tp2-dpattn@32768' -> ('tp2-dpattn', 32768); 'tp2' -> ('tp2', 16384)."""
    name, _, chunk = spec.partition("@")
    if chunk and not chunk.isdigit():
        raise ValueError(f"{spec!r}: the chunk after '@' must be a token count, e.g. tp2@32768")
    if name not in LAYOUTS:
        raise ValueError(f"unknown layout {name!r}; use one of {', '.join(LAYOUTS)}")
    return name, int(chunk or 16384)


def model_of(name: str, workdir: Path):
    """(model path, layers, engine extras) of the throughput runs."""
    from hsdump.testing import models

    if name == "kimi-width":
        path = models.build(name, workdir / f"model-{name}", weights="dummy")
        return path, [3, 5, 6], {"load_format": "dummy"}
    return models.build(name, workdir / f"model-{name}", tokenizer=True), [1, 3, 4], {}


def throughput(
    name: str,
    model: str,
    n: int,
    length: int,
    repeat: int,
    chunk: int,
    layers: List[int],
    model_extra: dict,
    port: Optional[int],
) -> dict:
    """port None: hsdump chooses it (serving.dp_attention_port under DP attention)."""
    from hsdump.capture.base import Request
    from hsdump.capture.layers import read_model_info
    from hsdump.capture.start import engine_preset, start
    from hsdump.testing.models import prompts as random_prompts

    tp, extra = LAYOUTS[name]
    extra = dict(extra, **model_extra)
    # under DP attention SGLang binds TCP ports derived from `port` alone, and the caller's
    # socket of an earlier engine in this process may still hold them
    if port is not None:
        extra["port"] = port
    ec = engine_preset("gpu", chunked_prefill_size=chunk, max_prefill_tokens=chunk, extra=extra)
    info = read_model_info(model)
    prompts = random_prompts([length] * n, seed=1, vocab=info.vocab_size)
    t0 = time.time()
    res = {"prompts": n, "length": length, "chunked_prefill_size": chunk, "layers": layers}
    count = {"n": 0}

    def sink(s):  # capture only: the rows are dropped
        count["n"] += 1

    with start(model, layers, ec, tp_size=tp, info=info) as eng:
        res["engine_start_s"] = round(time.time() - t0, 1)
        t = time.time()
        warm = prompts[: max(n // 8, 8)]
        eng.run([Request(i, p) for i, p in enumerate(warm)], sink)  # warm-up (kernel JIT)
        res["warmup_s"] = round(time.time() - t, 1)
        res["runs_tokens_per_s"] = []
        for _ in range(repeat):
            count["n"] = 0
            t = time.time()
            eng.run([Request(i, p) for i, p in enumerate(prompts)], sink)
            dt = time.time() - t
            assert count["n"] == n, (count["n"], n)
            res["runs_tokens_per_s"].append(round(n * length / dt))
        res["row_sources"] = eng.sources()
    res["tokens_per_s"] = max(res["runs_tokens_per_s"])
    res["median_tokens_per_s"] = round(statistics.median(res["runs_tokens_per_s"]))
    return res


def environment() -> dict:
    import torch

    from hsdump.store.manifest import versions

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    env.update(host=platform.node(), python=platform.python_version(), **versions())
    env["gpus"] = torch.cuda.device_count()
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", default="tp2-dpattn,tp2,tp2-ep2", help="LAYOUT[@CHUNK],...")
    ap.add_argument("--model", default="dsv3-small", choices=MODELS)
    ap.add_argument(
        "--auto-port",
        action="store_true",
        help="no explicit port: hsdump picks one (consecutive DP-attention engines in one "
        "process must start)",
    )
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=None, help="results JSON")
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--deadline-s", type=float, default=0, help="skip layouts once this much time has passed"
    )
    ap.add_argument(
        "--est-s", type=float, default=75, help="time one layout is expected to take (deadline)"
    )
    args = ap.parse_args(argv)
    specs = [x for x in args.layouts.split(",") if x]
    try:
        split = [split_layout(x) for x in specs]
    except ValueError as e:
        ap.error(str(e))
    t_start = time.time()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hsdump-layouts-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = {"env": environment(), "model": args.model, "throughput": {}}
    tp = report["throughput"]

    def save():
        report["elapsed_s"] = round(time.time() - t_start, 1)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1))

    model, layers, mextra = model_of(args.model, workdir)
    for i, (spec, (name, chunk)) in enumerate(zip(specs, split)):
        left = args.deadline_s - (time.time() - t_start)
        if args.deadline_s and left < args.est_s:
            tp[spec] = {"skipped": f"deadline ({left:.0f} s left)"}
            save()
            continue
        print(f"\n== throughput {spec}", flush=True)
        try:
            tp[spec] = throughput(
                name,
                model,
                args.prompts,
                args.length,
                args.repeat,
                chunk,
                layers,
                mextra,
                None if args.auto_port else 30000 + 1000 * i,
            )
        except Exception as e:  # keep going: the other layouts still tell something
            tp[spec] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        print(json.dumps(tp[spec], indent=1), flush=True)
        save()
    rows = [(k, v) for k, v in tp.items() if "tokens_per_s" in v]
    if rows:
        print(
            f"\ncapture throughput ({args.model}, {args.prompts} x {args.length} tokens per "
            f"pass, rows dropped)\n| layout | chunk | engine start s | passes tokens/s | median "
            f"| best | best / {rows[0][0]} |\n|---|---:|---:|---|---:|---:|---:|"
        )
        for k, v in rows:
            print(
                f"| {k} | {v['chunked_prefill_size']} | {v['engine_start_s']} | "
                f"{', '.join(f'{x:,}' for x in v['runs_tokens_per_s'])} | "
                f"{v['median_tokens_per_s']:,} | {v['tokens_per_s']:,} | "
                f"{v['tokens_per_s'] / rows[0][1]['tokens_per_s']:.3f} |"
            )
    save()
    return 0 if all("error" not in v for v in tp.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
