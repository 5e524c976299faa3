"""Throughput benchmark: plain SGLang prefill vs hsdump vs SGLang's built-in hidden-state path.

In one process, on one machine, with the same engine settings, model and samples, and one
engine at a time (each shut down before the next starts):

  a   plain prefill: `sglang.srt.entrypoints.engine.Engine`, no capture, `generate(...,
      max_new_tokens=1, return_hidden_states=False)` over all samples in one call;
  b0  hsdump capture only: `CaptureEngine.run` with a sink that drops the rows (same engine as b);
  b   hsdump end to end: `CaptureEngine` + `DatasetWriter` writing the dataset to local disk
      (timed until `writer.close()` has fsynced the last shard);
  b8  as b with `output.dtype=fp8` (`DatasetWriter(dtype="fp8")`: e4m3 rows plus a float32
      scale per token), on b's engine right after b (`--modes a,b,b8`; `--fp8-tokens` runs it
      on the first samples only);
  c   SGLang's built-in path: an Engine with aux capture on (0.5.17: EAGLE-3 layers set by a
      scheduler hook; 0.5.23: capture-only EAGLE3 mode) and `return_hidden_states=True`, the
      caller collecting the Python lists.

It also measures the output disk's sequential write bandwidth (dd with oflag=direct and with
conv=fdatasync) and the serial stages of the writer thread (safetensors serialize, sha256,
write+fsync) on one shard's worth of data. Peak host memory is the summed RSS of this process
and all its descendants (SGLang's scheduler and detokenizer), peak GPU memory is NVML's
device-wide `used` (summed over the engine's `--tp` GPUs); both are sampled every 0.2 s during
the timed window.

    make bench                                       # CPU-sized: tiny Llama, SGLang CPU engine
    python3 bench/bench.py --device cuda --models llama8b:2048:128:8 --name gpu-llama8b
    python3 bench/bench.py --device cuda --models llama8b:2048/8192 --deadline-s 560
    python3 bench/bench.py --device cuda --models kimi-width:2048 --modes a,b,b8,c --weights dummy
    python3 bench/bench.py --device cuda --tp 2 --models llama8b:2048:512:2 --modes a,b \
        --weights dummy                              # TP 2 on two GPUs (bench/README.md)
    python3 bench/writer_bench.py --dir /output/disk               # DatasetWriter alone

On the GPU machine, first `source .gpu/part1/install.sh` and put the repo on PYTHONPATH
(see bench/README.md). Sequence lengths of one model share its three engines.

Models: `tiny-llama` (CPU), `llama8b` (Llama-3.1-8B dimensions), `dsv3-small` (DeepSeek-V3
architecture, real MLA dims, hidden 512, 8 layers), `kimi-width` (DeepSeek-V3 architecture at
Kimi-K2.5's widths: hidden 7168, its MLA dims, 64 heads, expert width 2048, dense width 18432,
vocab 163840, yarn rope; 8 layers, the first dense, and 16 routed experts with top-8 plus the
shared one, so its 8.8 B parameters fit one GPU). `--weights files` (default) saves random
weights with save_pretrained; `--weights dummy` writes config.json alone and has SGLang fill
the weights at load (`load_format="dummy"`), which needs no disk and no build time.

Results: a table on stdout and bench/results/<name>.json (--results-dir to change).

Beside it: bench_modes.py (the engines and the timed modes), bench_monitor.py (memory, CPU,
disk and writer-stage measurements), bench_report.py (the table, the ratios, the environment).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import List, Optional

import torch

# mem_bench, regen_bench, start_bench, families_probe and neighbours import bench for
# build_model, _prepare, engine_config, sharegpt_lengths, _count_within and environment
from bench_modes import (
    WRITER_OPTS,
    Workload,
    _count_within,
    _prepare,
    engine_config,
    fp8_host_cost,
    mode_builtin,
    mode_hsdump,
    mode_plain,
    sharegpt_lengths,
)
from bench_monitor import Monitor, disk_bandwidth, writer_stages
from bench_report import _ratios, environment, table

from hsdump.testing import models, speed

HERE = Path(__file__).resolve().parent

# built by build_model(); capture layers from default_layers(); sizes chosen in main()
MODELS = ("tiny-llama", "llama-small", "llama8b", "dsv3-small", "kimi-width")
WEIGHTS = ("files", "dummy")


# --------------------------------------------------------------------------- models
def build_model(name: str, dest: str, weights: str = "files") -> str:
    """hsdump.testing.models' checkpoint of `name` (dsv3-small at 8 layers), reused if dest
    already holds one: random bf16 weights, built on the GPU where there is one; or, weights
    "dummy", config.json only (SGLang's load_format=dummy fills the weights)."""
    from hsdump.testing import models

    if name == "tiny-llama":
        from hsdump.tiny import resolve_model_path

        return resolve_model_path("tiny:llama")
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; use one of {MODELS}")
    kw = models.BENCH_KW.get(name, {})
    if weights == "dummy":
        return models.build(name, dest + "-dummy", weights="dummy", **kw)
    if (Path(dest) / "config.json").exists():
        return dest
    # built in a child process, so this process never holds GPU memory
    code = (
        "import sys, torch; from hsdump.testing import models; "
        "models.build(sys.argv[2], sys.argv[1], device='cuda' if torch.cuda.is_available() "
        "else 'cpu', **models.BENCH_KW.get(sys.argv[2], {}))"
    )
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", code, dest, name], check=True)
    return dest


def default_layers(name: str, num_layers: int) -> List[int]:
    if name in ("dsv3-small", "kimi-width"):  # the Kimi-K2.5 preset's [3, 31, 59] of 61 is
        # [3, L // 2 + 1, L - 2]; at L = 8: [3, 5, 6]
        return [3, num_layers // 2 + 1, num_layers - 2]
    from hsdump.capture.layers import eagle3_default

    return eagle3_default(num_layers)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="hsdump throughput benchmark (see module doc)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--models",
        default=None,
        help="comma list of MODEL:SEQ[/SEQ...][:N[:N_BUILTIN]]; MODEL in "
        + ", ".join(MODELS)
        + "; the sequence lengths of one model share its engines",
    )
    ap.add_argument("--modes", default="a,b,c")
    ap.add_argument("--name", default=None, help="results file name (default: the device)")
    ap.add_argument("--results-dir", default=str(HERE / "results"))
    ap.add_argument("--out-dir", default="/tmp/hsdump-bench", help="dataset and dd target")
    ap.add_argument("--model-dir", default="/tmp/hsdump-bench-models")
    ap.add_argument(
        "--tp",
        type=int,
        default=1,
        help="SGLang tensor-parallel size of every mode's engine (a, b0, b, b8, c)",
    )
    ap.add_argument("--mem-fraction", type=float, default=None)
    ap.add_argument("--dd-mib", type=int, default=None)
    ap.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed runs per mode, median reported (default: 2 on CPU, 1 on GPU)",
    )
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=0,
        help="skip modes that would start after this many seconds",
    )
    ap.add_argument(
        "--deadline-modes",
        default=None,
        help="comma list: the modes the deadline may skip (default: all)",
    )
    ap.add_argument(
        "--tokens",
        type=int,
        default=0,
        help="tokens per timed run and length (default 2M small models, 0.5M 8B)",
    )
    ap.add_argument("--writer-threads", type=int, default=None)
    ap.add_argument("--shard-mib", type=int, default=None)
    ap.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="files",
        help="files: random weights saved with save_pretrained; dummy: config.json "
        "only, SGLang fills random weights at load (load_format=dummy)",
    )
    ap.add_argument(
        "--no-cuda-graph",
        action="store_true",
        help="disable_cuda_graph=True in every mode: skips capturing decode graphs "
        "that max_new_tokens=1 never replays (MLA models run no prefill graph)",
    )
    ap.add_argument(
        "--fp8-tokens",
        type=int,
        default=0,
        help="mode b8 on the first samples holding this many tokens (0: all of b's)",
    )
    ap.add_argument(
        "--writer-stages-mib",
        type=int,
        default=None,
        help="MiB of the serial writer-stage probe (default 1024 GPU, 64 CPU; 0 skips)",
    )
    ap.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="the engine's context_length (SGLang's): above the model's "
        "max_position_embeddings (131,072 for llama8b) for samples of 128K tokens and more; "
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 is set for it",
    )
    ap.add_argument(
        "--final",
        default="",
        help="comma list of final states mode b captures beside the layers (pre_norm, "
        "post_norm): a capture with EAGLE-3's training target, as SpecForge's records hold it",
    )
    args = ap.parse_args(argv)
    final = tuple(x for x in args.final.split(",") if x)
    bad = [x for x in final if x not in ("pre_norm", "post_norm")]
    if bad:
        ap.error(f"--final {args.final}: {bad} is not a final state (pre_norm, post_norm)")
    if args.tp < 1:
        ap.error(f"--tp {args.tp}: must be >= 1")
    tp = args.tp
    if args.writer_threads:
        WRITER_OPTS["threads"] = args.writer_threads
    if args.shard_mib:
        WRITER_OPTS["shard_bytes"] = args.shard_mib << 20
    dev = args.device
    gpu = dev == "cuda"
    if args.models is None:
        args.models = "llama8b:2048,dsv3-small:2048" if gpu else "tiny-llama:256:32:16"
    name = args.name or ("gpu" if gpu else "cpu")
    repeat = args.repeat or (1 if gpu else 2)
    t_start = time.time()
    _prepare(dev)
    from hsdump.capture.layers import read_model_info
    from hsdump.capture.serving import sglang_version

    version = sglang_version()
    report = {
        "name": name,
        "command": " ".join([sys.executable] + sys.argv),
        "env": environment(dev),
        "sglang": version,
        "tp": tp,
        "runs": {},
    }
    out_json = Path(args.results_dir) / f"{name}.json"

    def save():
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(report, indent=1, default=str))

    mon = Monitor(gpus=tp)
    mon.start()
    report["gpu_memory"] = f"NVML used, summed over the first {tp} visible GPU(s)"
    ec = engine_config(dev, args.mem_fraction)
    if args.no_cuda_graph:
        ec.disable_cuda_graph = True
    if args.context_length:
        ec.extra["context_length"] = args.context_length
        os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    # FlashInfer's all-reduce fusion (a 3-minute JIT build at TP > 1) is off as in gpu.yaml:
    # serving.start_kwargs, which plain_kwargs and CaptureEngine apply
    report["weights"] = args.weights
    report["writer_opts"] = dict(WRITER_OPTS)
    report["engine_config"] = {k: getattr(ec, k) for k in ec.__dataclass_fields__}
    report["disk"] = disk_bandwidth(args.out_dir, args.dd_mib or (4096 if gpu else 256))
    print("disk:", json.dumps(report["disk"]))
    save()

    for spec in [s for s in args.models.split(",") if s]:
        parts = spec.split(":")
        mname = parts[0]
        seqs = [x if x == "sharegpt" else int(x) for x in parts[1].split("/")]
        small = mname in ("tiny-llama", "dsv3-small")
        if args.weights == "dummy":
            ec.extra["load_format"] = "dummy"
        t_build = time.time()
        model_path = build_model(mname, os.path.join(args.model_dir, mname), args.weights)
        build_s = time.time() - t_build
        info = read_model_info(model_path)
        layers = default_layers(mname, info.num_hidden_layers)
        stages_mib = (
            (1024 if gpu else 64) if args.writer_stages_mib is None else args.writer_stages_mib
        )
        if "writer_stages" not in report and stages_mib > 0:
            report["writer_stages"] = writer_stages(
                args.out_dir, stages_mib << 20, len(layers) * info.hidden_size
            )
            print("writer stages:", json.dumps(report["writer_stages"]))
        modes = [m for m in args.modes.split(",") if m]
        if "b8" in modes:
            cost = fp8_host_cost(info.hidden_size, len(layers))
            report.setdefault("fp8_host_quantize", {})[mname] = cost
            print("fp8 encode on the host:", json.dumps(cost))
        vocab = json.load(open(os.path.join(model_path, "config.json")))["vocab_size"]
        loads, runs = [], {}
        for seq in seqs:
            # default sizes: ~2M tokens (small models) or ~0.5M tokens (8B) per timed run;
            # the built-in path gets ~64k / ~16k tokens (its Python lists take ~30x the bytes)
            budget = args.tokens or ((2 << 20) if small else (1 << 19))
            lens = sharegpt_lengths() if seq == "sharegpt" else None
            if lens is not None:
                n = int(parts[2]) if len(parts) > 2 else _count_within(lens, budget)
                nc = (
                    int(parts[3])
                    if len(parts) > 3
                    else max(1, _count_within(lens, 65536 if small else 16384))
                )
                lens = lens[:n]
                g = torch.Generator().manual_seed(4321)
            else:
                n = int(parts[2]) if len(parts) > 2 else max(8, budget // seq)
                # past 8,192 tokens one sample's lists alone take > 10 GB: c is not run
                nc = (
                    int(parts[3])
                    if len(parts) > 3
                    else (
                        0 if seq > 8192 else max(2, 65536 // seq) if small else max(1, 16384 // seq)
                    )
                )
                lens = [seq] * n
                g = torch.Generator().manual_seed(4321 + seq)  # the warm-up's ids
            # fixed lengths: models.bench_ids, the ids another tool is given to time the same
            samples = (
                [torch.randint(10, vocab, (m,), generator=g).tolist() for m in lens]
                if seq == "sharegpt"
                else models.bench_ids(n, seq, vocab)
            )
            w_len = 2048 if seq == "sharegpt" else seq
            warm_n = max(2, 32768 // w_len) if gpu else 4
            warm = [torch.randint(10, vocab, (w_len,), generator=g).tolist() for _ in range(warm_n)]
            loads.append(Workload(seq, samples, warm, nc))
            key = f"{mname}:{seq}"
            runs[seq] = report["runs"][key] = {
                "model": mname,
                "model_path": model_path,
                "architecture": info.architecture,
                "hidden_size": info.hidden_size,
                "num_hidden_layers": info.num_hidden_layers,
                "seq": seq,
                "samples": n,
                "samples_builtin": nc,
                "layers": layers,
                "final": list(final),
                "weights": args.weights,
                "tp": tp,
                "tokens": loads[-1].tokens,
                "ids_sha256": speed.ids_digest(samples),  # what bench/speed_pair.py pairs on
                "repeat": repeat,
                "model_build_s": build_s,
            }
        engines = report.setdefault("engines", {}).setdefault(mname, {})
        # seconds a mode takes: a rough constant until one mode has run, then that mode's time
        est = 90 if small else 60 + 45 * len(seqs)
        for mode in modes:
            if mode == "b8" and "b" in modes:
                continue  # runs on b's engine, right after b
            starts = [e["engine_start_s"] for e in engines.values() if "engine_start_s" in e]
            if mode == "c" and starts:
                est = starts[-1] + 45  # an engine start like the last one, plus a few samples
            may_skip = args.deadline_modes is None or mode in args.deadline_modes.split(",")
            if args.deadline_s and may_skip and time.time() - t_start + est > args.deadline_s:
                engines[mode] = {"error": "skipped: deadline"}
                for seq in seqs:
                    runs[seq][mode] = {"error": "skipped: deadline"}
                print(f"[{mname}] mode {mode}: skipped (deadline)")
                continue
            print(f"[{mname}] mode {mode} ... (t={time.time() - t_start:.0f} s)", flush=True)
            t_mode = time.time()

            def partial(seq, res):  # b0, b, b8 saved as each ends
                runs[seq][mode] = dict(res)
                _ratios(runs[seq], report["disk"])
                save()

            def run_mode():
                if mode == "a":
                    return mode_plain(model_path, ec, loads, mon, repeat, tp)
                if mode in ("b", "b8"):
                    storages = ["bfloat16"] * (mode == "b") + ["fp8"] * ("b8" in modes)
                    return mode_hsdump(
                        model_path,
                        ec,
                        loads,
                        layers,
                        info,
                        args.out_dir,
                        mon,
                        repeat,
                        storages,
                        args.fp8_tokens,
                        partial,
                        tp,
                        final,
                    )
                if mode == "c":
                    return mode_builtin(
                        model_path, ec, loads, layers, info, version, mon, repeat, tp
                    )
                raise ValueError(f"unknown mode {mode}")

            try:
                try:
                    res = run_mode()
                except Exception as e:
                    # SGLang's dummy weights failed before anything ran: build weight files
                    # and try this mode again (the modes after it then use the files too)
                    if ec.extra.get("load_format") != "dummy" or engines:
                        raise
                    print(traceback.format_exc())
                    print(f"[{mname}] dummy weights failed; building weight files")
                    report.setdefault("dummy_fallback", {})[mname] = f"{type(e).__name__}: {e}"
                    ec.extra.pop("load_format")
                    t_build = time.time()
                    model_path = build_model(mname, os.path.join(args.model_dir, mname))
                    for seq in seqs:
                        runs[seq].update(
                            model_path=model_path,
                            weights="files",
                            model_build_s=time.time() - t_build,
                        )
                    res = run_mode()
                engines[mode] = res.pop("_engine")
                for seq in seqs:
                    runs[seq][mode] = res.get(seq, {"error": "not measured"})
            except Exception as e:
                err = {
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()[-3000:],
                }
                engines[mode] = err
                for seq in seqs:
                    runs[seq].setdefault(mode, err)
                print(traceback.format_exc())
            _wait_gpu_free(mon, (engines.get("a") or {}).get("baseline", {}).get("gpu_used_bytes"))
            est = time.time() - t_mode
            for seq in seqs:
                _ratios(runs[seq], report["disk"])
            save()
        for seq in seqs:
            print()
            print(table(name, runs[seq], tp))
        print(
            "engine start s: "
            + ", ".join(
                f"{m} {e.get('engine_start_s', float('nan')):.1f}" for m, e in engines.items()
            )
        )
        print()
    mon.stop()
    report["elapsed_s"] = time.time() - t_start
    save()
    print(f"wrote {out_json} ({report['elapsed_s']:.0f} s)")
    return 0


def _wait_gpu_free(mon: Monitor, baseline: Optional[int], timeout: float = 30.0) -> None:
    """Engines free GPU memory asynchronously; wait until use is back near the baseline."""
    if baseline is None:
        return
    t = time.time()
    while time.time() - t < timeout:
        u = mon.gpu.used()
        if u is None or u < baseline + (2 << 30):
            return
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
