"""SGLang 0.5.23's own aux hidden-state path against hsdump's capture patch, on the same prompts.

SGLang 0.5.23 can capture EAGLE-3 aux hidden states without a draft model
(`speculative_algorithm="EAGLE3"`, `enable_return_aux_hidden_states=True`,
`return_aux_hidden_state_layer_ids=ids`) and return them per request in
`meta_info["hidden_states"]` (the scheduler's `.cpu().clone().tolist()`, then two ZMQ hops as
Python lists). hsdump turns the same mode on and then takes the rows itself (hsdump.capture.patch:
packed on the device in the logits processor, sent as raw frames, SGLang's `.tolist()` skipped).
This script runs both, one engine after the other, on the same model, layers and prompts, and
reports:

  * rows: per sample, whether SGLang returned len(input_ids) rows (its path keeps only the last
    chunk of a chunked prefill, so `--chunk` below the prompt length shows the loss), and per
    layer how far SGLang's rows are from hsdump's: the fraction of bitwise-equal rows, the worst
    absolute difference and the relative error ||a - b|| / ||b||;
  * speed: prompt tokens per second of one call over all prompts (median of --repeat), after a
    one-prompt warm-up, for each path.

Both engines get bench.py's engine settings (conf/engine/gpu.yaml or cpu.yaml as bench.py uses
them) and `ids = [k - 1 for k in layers]` (hsdump's layer k is HF hidden_states[k]; Llama's
setter shifts ids by +1; other families' setters use other rules, so this script is for Llama,
the family whose convention both sides share).

    .venv/bin/python bench/aux_mode.py --device cpu                  # tiny Llama, CPU engine
    python3 bench/aux_mode.py --device cuda --out $OUT/aux-mode.json # Llama-3.1-8B shape, dummy
    python3 bench/aux_mode.py --device cuda --prompts 16 --seq 2048 --chunk 1024   # chunk loss
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import torch  # noqa: E402

SP = {"max_new_tokens": 1, "temperature": 0.0}


def prompts(n: int, seq: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, vocab - 10, (seq,), generator=g).tolist() for _ in range(n)]


def run_hsdump(model_path, ec, layers, info, samples, warm, repeat):
    """hsdump's CaptureEngine: rows per sample as float32 [K, T, H], and the call walls."""
    from hsdump.capture.engine import CaptureEngine
    from hsdump.config import ModelConfig

    t0 = time.time()
    eng = CaptureEngine(model_path, ModelConfig(path=model_path), ec, layers, info)
    start_s = time.time() - t0
    rows, walls = {}, []
    base = [0]

    def sids(items):
        base[0] += 1_000_000
        return [(base[0] + i, s) for i, s in enumerate(items)]

    try:
        t = time.time()
        eng.run(sids([warm]), lambda *a: None)
        warm_s = time.time() - t
        for r in range(repeat):
            got = {}

            def sink(sid, ids, hs, bad, got=got):
                got[sid % 1_000_000] = torch.stack([h.float() for h in hs[: len(layers)]]).numpy()

            t = time.time()
            eng.run(sids(samples), sink)
            walls.append(time.time() - t)
            if r == 0:
                rows = got
    finally:
        eng.close()
    return rows, walls, {"engine_start_s": start_s, "warmup_s": warm_s, "sglang": eng.version}


def run_builtin(model_path, ec, layers, samples, warm, repeat, version):
    """SGLang's own return path (bench.py's mode c engine): rows per sample as [K, T, H]."""
    import bench

    t0 = time.time()
    eng = bench.builtin_engine(model_path, ec, layers, version)
    start_s = time.time() - t0
    rows, walls, counts = {}, [], []
    k = len(layers)
    try:
        t = time.time()
        eng.generate(input_ids=[warm], sampling_params=SP, return_hidden_states=True)
        warm_s = time.time() - t
        for r in range(repeat):
            t = time.time()
            outs = eng.generate(input_ids=samples, sampling_params=SP, return_hidden_states=True)
            lists = [o["meta_info"]["hidden_states"] for o in outs]
            walls.append(time.time() - t)
            if r == 0:
                for i, hs in enumerate(lists):
                    a = np.asarray(hs[0] if hs else [], dtype=np.float32)
                    counts.append(int(a.shape[0]) if a.ndim == 2 else 0)
                    if a.ndim == 2 and a.shape[1] % k == 0:
                        h = a.shape[1] // k
                        rows[i] = a.reshape(a.shape[0], k, h).transpose(1, 0, 2).copy()
            del outs, lists
    finally:
        eng.shutdown()
    return rows, walls, {"engine_start_s": start_s, "warmup_s": warm_s, "rows_returned": counts}


def compare(a: dict, b: dict, samples, layers) -> dict:
    """a: SGLang's rows, b: hsdump's (the reference), per layer over all samples."""
    per_layer = {}
    short = []
    for i, s in enumerate(samples):
        if i not in a or a[i].shape[1] != len(s):
            short.append(
                {"sample": i, "tokens": len(s), "rows": int(a[i].shape[1]) if i in a else 0}
            )
    for j, k in enumerate(layers):
        eq = tot = 0
        worst = 0.0
        num = den = 0.0
        for i in range(len(samples)):
            if i not in a or i not in b or a[i].shape[1] != b[i].shape[1]:
                continue
            x, y = a[i][j], b[i][j]
            eq += int(np.all(x == y, axis=-1).sum())
            tot += x.shape[0]
            d = x.astype(np.float64) - y.astype(np.float64)
            worst = max(worst, float(np.abs(d).max()))
            num += float((d * d).sum())
            den += float((y.astype(np.float64) ** 2).sum())
        per_layer[str(k)] = {
            "rows_compared": tot,
            "bitwise_equal_rows": eq,
            "max_abs_diff": worst,
            "rel_err": (num**0.5) / (den**0.5) if den > 0 else None,
        }
    return {"short_samples": short, "per_layer": per_layer}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", default=None, help="bench.py model (cpu: tiny-llama; cuda: llama8b)")
    ap.add_argument(
        "--weights",
        choices=("files", "dummy"),
        default=None,
        help="bench.py --weights (cuda default: dummy, SGLang's seeded dummy init)",
    )
    ap.add_argument("--prompts", type=int, default=None, help="cpu 4, cuda 16")
    ap.add_argument("--seq", type=int, default=None, help="tokens per prompt (cpu 64, cuda 2048)")
    ap.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="chunked_prefill_size for both engines (default: the preset's)",
    )
    ap.add_argument("--layers", default=None, help="comma list (default: bench.py's for the model)")
    ap.add_argument("--repeat", type=int, default=None, help="timed hsdump calls (cpu 1, cuda 3)")
    ap.add_argument(
        "--builtin-repeat",
        type=int,
        default=1,
        help="timed calls of SGLang's path (slow: 0.7k tokens/s at 3 x 4096 on an H200)",
    )
    ap.add_argument("--model-dir", default="/tmp/hsdump-bench-models")
    ap.add_argument("--mem-fraction", type=float, default=None)
    ap.add_argument("--out", default=None, help="results JSON")
    args = ap.parse_args(argv)
    gpu = args.device == "cuda"
    model = args.model or ("llama8b" if gpu else "tiny-llama")
    weights = args.weights or ("dummy" if gpu else "files")
    n = args.prompts or (16 if gpu else 4)
    seq = args.seq or (2048 if gpu else 64)
    repeat = args.repeat or (3 if gpu else 1)

    import bench
    from hsdump.capture.layers import read_model_info
    from hsdump.capture.serving import sglang_version

    bench._prepare(args.device)
    version = sglang_version()
    if version == "0.5.17":
        print(
            "note: SGLang 0.5.17 has no enable_return_aux_hidden_states; the built-in side "
            "runs bench.py's 0.5.17 scheduler hook instead",
            flush=True,
        )
    ec = bench.engine_config(args.device, args.mem_fraction)
    if weights == "dummy":
        ec.extra["load_format"] = "dummy"
    if args.chunk is not None:
        ec.chunked_prefill_size = args.chunk
    model_path = bench.build_model(model, os.path.join(args.model_dir, model), weights)
    info = read_model_info(model_path)
    layers = (
        sorted(int(x) for x in args.layers.split(","))
        if args.layers
        else sorted(bench.default_layers(model, info.num_hidden_layers))
    )
    vocab = info.vocab_size or 32000
    samples = prompts(n, seq, vocab)
    warm = prompts(1, seq, vocab, seed=1)[0]
    tokens = n * seq
    report = {
        "command": " ".join([sys.executable] + sys.argv),
        "sglang": version,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "model": model,
        "weights": weights,
        "layers": layers,
        "hidden_size": info.hidden_size,
        "prompts": n,
        "seq": seq,
        "chunked_prefill_size": ec.chunked_prefill_size,
        "repeat": repeat,
    }
    print(json.dumps(report), flush=True)

    def save():
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")

    # one engine at a time: hsdump's first, then SGLang's own path
    hs_rows, hs_walls, hs_info = run_hsdump(model_path, ec, layers, info, samples, warm, repeat)
    report["hsdump"] = {
        **hs_info,
        "walls_s": hs_walls,
        "tokens_per_s": tokens / statistics.median(hs_walls),
    }
    save()
    bi_rows, bi_walls, bi_info = run_builtin(
        model_path, ec, layers, samples, warm, args.builtin_repeat, version
    )
    report["builtin"] = {
        **bi_info,
        "walls_s": bi_walls,
        "tokens_per_s": tokens / statistics.median(bi_walls),
    }
    report["rows"] = compare(bi_rows, hs_rows, samples, layers)
    report["speedup_hsdump_over_builtin"] = (
        report["hsdump"]["tokens_per_s"] / report["builtin"]["tokens_per_s"]
    )
    save()

    print(
        f"\n{model} ({weights} weights), {n} prompts x {seq} tokens, layers {layers}, "
        f"chunked_prefill_size {ec.chunked_prefill_size}, sglang {version}"
    )
    print(f"{'path':<30}{'tokens/s':>12}{'engine start s':>16}{'rows per sample ok':>20}")
    ok_bi = n - len(report["rows"]["short_samples"])
    print(
        f"{'hsdump patch':<30}{report['hsdump']['tokens_per_s']:>12.0f}"
        f"{hs_info['engine_start_s']:>16.1f}{f'{len(hs_rows)}/{n}':>20}"
    )
    print(
        f"{'SGLang enable_return_aux':<30}{report['builtin']['tokens_per_s']:>12.0f}"
        f"{bi_info['engine_start_s']:>16.1f}{f'{ok_bi}/{n}':>20}"
    )
    print(f"\n{'layer':<8}{'rows':>8}{'bitwise equal':>15}{'max |diff|':>12}{'rel err':>10}")
    for k, r in report["rows"]["per_layer"].items():
        rel = "-" if r["rel_err"] is None else f"{r['rel_err']:.2e}"
        print(
            f"{k:<8}{r['rows_compared']:>8}{r['bitwise_equal_rows']:>15}"
            f"{r['max_abs_diff']:>12.3g}{rel:>10}"
        )
    print(f"\nhsdump / built-in speed: {report['speedup_hsdump_over_builtin']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
