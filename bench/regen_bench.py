"""Regeneration throughput: hsdump's generate (CaptureEngine.generate, what `regenerate.turns`
uses) against SGLang's own batched `Engine.generate` of the same prompts, in one engine and one
run, then the capture of the regenerated sequences, so that regenerate-and-capture in one run
can be set against the two separate steps (a generation engine, then a capture engine).

    python bench/regen_bench.py                                   # CPU: tiny Llama
    python bench/regen_bench.py --device cuda --model llama8b --weights dummy --samples 256 \\
        --prompt-len 512 --max-new-tokens 256 --json $OUT/regen.json

Every request generates exactly --max-new-tokens (ignore_eos), greedy. Modes, in order:
warm-up (8 requests each way, untimed), s = SGLang's generate, h = hsdump's generate, then
both again (s2, h2; h/s compares the best of each), c = capture of prompt + generated tokens (null sink). "one run" = engine start +
h + c; "two steps" = engine start + s + engine start + c (the start measured once, counted
twice: a second engine for the capture step).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--weights", default="files", choices=("files", "dummy"))
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--models-dir", default="/tmp/hsdump-bench-models")
    ap.add_argument("--json")
    a = ap.parse_args(argv)

    import bench
    from hsdump.capture.base import Request
    from hsdump.capture.layers import read_model_info, resolve_layers
    from hsdump.capture.start import engine_preset, start

    path = bench.build_model(a.model, f"{a.models_dir}/{a.model}", a.weights)
    info = read_model_info(path)
    layers = resolve_layers(None, None, info.num_hidden_layers)
    extra = {"load_format": "dummy"} if a.weights == "dummy" else {}
    ec = engine_preset("gpu" if a.device == "cuda" else "cpu", extra=extra)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, min(info.vocab_size, 30000), (a.prompt_len,), generator=g).tolist()
        for _ in range(a.samples)
    ]
    sp = {"max_new_tokens": a.max_new_tokens, "temperature": 0.0, "ignore_eos": True}
    res = {
        "device": a.device,
        "model": a.model,
        "samples": a.samples,
        "prompt_len": a.prompt_len,
        "max_new_tokens": a.max_new_tokens,
    }
    t = time.perf_counter()
    eng = start(path, layers, ec, info=info, generates=True)
    res["engine_start_s"] = time.perf_counter() - t
    try:
        eng.generate([(i, p, sp) for i, p in enumerate(prompts[:8])])  # warm-up, both paths
        eng._engine.generate(input_ids=prompts[:8], sampling_params=sp)
        out = {}
        for mode in ("s", "h", "s2", "h2"):
            t = time.perf_counter()
            if mode.startswith("h"):
                got = eng.generate([(i, p, sp) for i, p in enumerate(prompts)])
                gen = [got[i]["output_ids"] for i in range(len(prompts))]
            else:
                got = eng._engine.generate(input_ids=prompts, sampling_params=sp)
                gen = [o["output_ids"] for o in got]
            dt = time.perf_counter() - t
            n = sum(len(x) for x in gen)
            res[mode] = {"s": dt, "tokens": n, "tok_per_s": n / dt}
            out[mode] = gen
            print(json.dumps({mode: res[mode]}), flush=True)
        res["same_tokens"] = out["h"] == out["s"]  # greedy: expected, not guaranteed (batching)
        full = [(i, p + g_) for i, (p, g_) in enumerate(zip(prompts, out["h"]))]
        t = time.perf_counter()
        eng.run([Request(i, ids) for i, ids in full], lambda s: None)
        dt = time.perf_counter() - t
        res["c"] = {
            "s": dt,
            "tokens": sum(len(x[1]) for x in full),
            "tok_per_s": sum(len(x[1]) for x in full) / dt,
        }
    finally:
        eng.close()
    s = min(res["s"]["s"], res["s2"]["s"])
    h = min(res["h"]["s"], res["h2"]["s"])
    res["h_over_s_tok_per_s"] = s / h  # best of two each, same tokens
    res["one_run_s"] = res["engine_start_s"] + h + res["c"]["s"]
    res["two_steps_s"] = 2 * res["engine_start_s"] + s + res["c"]["s"]
    print(
        f"| s (SGLang generate) tok/s | h (hsdump generate) tok/s | h/s | c (capture) tok/s | "
        f"engine start s | one run s | two steps s |\n|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {res['s']['tok_per_s']:,.0f} / {res['s2']['tok_per_s']:,.0f} | "
        f"{res['h']['tok_per_s']:,.0f} / {res['h2']['tok_per_s']:,.0f} | "
        f"{res['h_over_s_tok_per_s']:.3f} | "
        f"{res['c']['tok_per_s']:,.0f} | {res['engine_start_s']:.1f} | {res['one_run_s']:.1f} | "
        f"{res['two_steps_s']:.1f} |"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
