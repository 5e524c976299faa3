"""Serving layouts of a DeepSeek-V3-architecture model and a Llama through extract.py, on 2 GPUs.

For each layout, one `extract.py` run writes the embedded 100 conversations (99 samples,
DeepSeek tokenizer, `dataset.max_seq_len=256`) captured at layers [1, 3, 4] of a random
model built here: a DeepSeek-V3-config model (real MLA dims, 8 experts top-2, hidden 512,
6 layers) or a Llama (bench/gpu_check.py's: hidden 256, 6 layers, 4 heads, 2 KV heads), both
with the DeepSeek tokenizer's vocabulary. 128-token chunked prefill (64 per rank under DP
attention) so requests span chunks and DP ranks sit idle while others prefill. Each dataset
is checked with `python -m hsdump verify` and every stored tensor is compared with
transformers (float32, the project's tolerance rule of tests/tolerance.py, against
transformers' own bf16 error) and with its model's TP 1 dataset (same rule, TP 1 in place of
the float32 reference).

Layouts of the DeepSeek-V3 model: tp1 (reference), tp2 (`model.tp_size=2`), tp2-dpattn
(+ `dp_size=2 enable_dp_attention=true`), tp2-ep2 (+ `ep_size=2`, default
moe_a2a_backend=none). Of the Llama: llama-tp1 (its reference), llama-tp2.

Throughput (`--throughput`): per layout, CaptureEngine with the GPU preset (16,384-token
chunks, or `layout@chunk`, e.g. `tp2-dpattn@32768`: SGLang divides the chunk by dp_size under
DP attention), 2,048-token random prompts, rows dropped by the sink (capture only: the small
MoE's rows outrun the disk, which would hide the layouts' differences); one warm-up pass, then
timed passes. `--throughput-model kimi-width` runs bench/bench.py's DeepSeek-V3 model at
Kimi-K2.5's widths (hidden 7168, its MLA and expert dims, 8 layers, 16 experts top-8; SGLang's
dummy weights) at layers [3, 5, 6] instead of the small MoE.

    source .gpu/part1/install.sh || exit 1; python3 -m pip install -q --no-index --no-deps \
        --target /tmp/site .whl/*.whl; export PYTHONPATH=.:/tmp/site
    python3 bench/gpu_layouts.py --out results.json                      # everything
    python3 bench/gpu_layouts.py --layouts tp1,tp2-dpattn --throughput ""  # a subset
    python3 bench/gpu_layouts.py --layouts '' --throughput-model kimi-width \
        --throughput tp2,tp2-ep2,tp2-dpattn,tp2-dpattn@32768 --prompts 256 --repeat 3
    python3 bench/gpu_layouts.py --layouts llama-tp1,llama-tp2 --throughput ""
    python3 bench/gpu_layouts.py --device cpu --layouts llama-tp1 --throughput ""  # CPU debug

tests/test_gpu_layouts.py runs the same through pytest (marked gpu; needs 2 GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

import gpu_check as gc  # noqa: E402  (bench/gpu_check.py: model config, references)
import tolerance as tol  # noqa: E402  (tests/tolerance.py: the tolerance rule)
import torch  # noqa: E402

LAYERS = [1, 3, 4]  # Kimi-K2.5's preset [3, 31, 59] of L = 61 scaled to L = 6
CHUNK = 128
# common to every layout (the GPU preset already keeps FlashInfer's all-reduce fusion and its
# 3-minute JIT build at TP 2 off: engine.flashinfer_allreduce_fusion=false)
COMMON = [
    "engine=gpu",
    "engine.mem_fraction_static=0.5",
    f"engine.chunked_prefill_size={CHUNK}",
    f"capture.layers=[{','.join(map(str, LAYERS))}]",
    "output.overwrite=true",
    "progress=false",
]
# the models (built by build_model) and each one's reference layout
MODELS = {
    "dsv3": {"name": "dsv3-small", "reference": "tp1"},
    "llama": {"name": "llama-small", "reference": "llama-tp1"},
}
LAYOUTS: Dict[str, Dict] = {
    "tp1": {"tp": 1, "extra": {}, "model": "dsv3"},
    "tp2": {"tp": 2, "extra": {}, "model": "dsv3"},
    "tp2-dpattn": {"tp": 2, "extra": {"dp_size": 2, "enable_dp_attention": True}, "model": "dsv3"},
    "tp2-ep2": {"tp": 2, "extra": {"ep_size": 2}, "model": "dsv3"},
    "llama-tp1": {"tp": 1, "extra": {}, "model": "llama"},
    "llama-tp2": {"tp": 2, "extra": {}, "model": "llama"},
}
LAST_REPORT: dict = {}  # main()'s report, for tests/test_gpu_layouts.py
DEVICE = {"name": "cuda"}
REUSE = {"on": False}  # --device cpu: a debug run of this script (tiny Llama, SGLang's CPU engine)


def model_of(name: str) -> str:
    return LAYOUTS[name]["model"]


def reference_of(name: str) -> str:
    """The layout whose dataset `name`'s is compared with (its model's TP 1)."""
    return MODELS[model_of(name)]["reference"]


def overrides(name: str) -> List[str]:
    lay = LAYOUTS[name]
    out = [f"model.tp_size={lay['tp']}"]
    for k, v in lay["extra"].items():
        out.append(f"+engine.extra.{k}={str(v).lower() if isinstance(v, bool) else v}")
    return out


# --------------------------------------------------------------------------- model
def build_model(dest: str, seed: int = 0, family: str = "dsv3") -> str:
    """gpu_check's DeepSeek-V3 config (family "dsv3") or Llama config ("llama") with the
    DeepSeek tokenizer's vocabulary (129,280), saved with that tokenizer and hsdump's
    DeepSeek-V3 chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hsdump.tiny import save_tokenizer

    if (Path(dest) / "config.json").exists():
        return dest
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_tokenizer(Path(tmp))
    cfg = {"dsv3": gc.deepseek_v3_config, "llama": gc.llama_config}[family]()
    cfg.vocab_size = len(AutoTokenizer.from_pretrained(tmp))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(tmp)
    os.replace(tmp, dest)
    return dest


# --------------------------------------------------------------------------- extract.py
def run_extract(name: str, model: str, workdir: str, timeout_s: float) -> dict:
    out_dir = os.path.join(workdir, f"ds-{name}")
    common = (
        COMMON
        if DEVICE["name"] == "cuda"
        else (["engine=cpu", f"engine.chunked_prefill_size={CHUNK}"] + COMMON[3:])
    )
    cmd = (
        [
            sys.executable,
            str(ROOT / "extract.py"),
            f"model.path={model}",
            f"model.name={MODELS[model_of(name)]['name']}",
            f"output.dir={out_dir}",
            f"hydra.run.dir={workdir}/hydra-{name}",
        ]
        + common
        + overrides(name)
    )
    log_path = os.path.join(workdir, f"extract-{name}.log")
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # SGLang's children too
            proc.wait()
            rc = "timeout"
    wall = time.time() - t0
    text = Path(log_path).read_text(errors="replace")
    res = {
        "command": "python3 extract.py " + " ".join(cmd[2:]),
        "rc": rc,
        "wall_s": round(wall, 1),
        "out_dir": out_dir,
    }
    m = re.search(r"samples written: (\d+)", text)
    res["samples_written"] = int(m.group(1)) if m else None
    m = re.search(r"wall time: ([\d.]+) s \(engine start ([\d.]+) s\)", text)
    if m:
        res["run_wall_s"], res["engine_start_s"] = float(m.group(1)), float(m.group(2))
    m = re.search(r"captured rows came from (\d+) scheduler process\(es\): (.*)", text)
    res["row_sources"] = m.group(2).strip() if m else None
    res["n_row_sources"] = int(m.group(1)) if m else None
    if rc != 0:
        res["log_tail"] = text[-6000:]
    return res


def verify(out_dir: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "hsdump", "verify", out_dir],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return {"rc": p.returncode, "tail": (p.stdout + p.stderr)[-1500:]}


def read_dataset(out_dir: str) -> Dict[int, dict]:
    from hsdump.store.reader import HsdumpDataset

    ds = HsdumpDataset(out_dir)
    assert list(ds.layers) == LAYERS, (ds.layers, LAYERS)
    out = {}
    for sid in ds.ids:
        rec = ds.get(sid)
        out[sid] = {
            "input_ids": rec["input_ids"].clone(),
            "hidden_states": [h.clone() for h in rec["hidden_states"]],
        }
    return out


def compare_records(recs: Dict[int, dict], ids: List[int], prompts, ref32, ref16) -> dict:
    """gc.compare over the samples `ids` (records keyed by sample id; `prompts` and the
    references in the order of `ids`)."""
    by_pos = {i: recs[sid] for i, sid in enumerate(ids) if sid in recs}
    res = gc.compare(by_pos, prompts, LAYERS, ref32, ref16)
    extra = sorted(set(recs) - set(ids))
    if extra:
        res["problems"].append(f"samples {extra[:10]} are not in the reference layout")
    res["tolerance_failures"] = tol.tolerance_failures(res)
    res["summary"] = gc.summarize(res)
    return res


def compare_with(recs: Dict[int, dict], base: Dict[int, dict], ids: List[int], ref16_err) -> dict:
    """Each tensor against the reference layout's, judged by the same rule (the reference
    layout in place of transformers float32; the scale is still transformers' bf16 error)."""
    res = {
        "layers": LAYERS,
        "prompt_lens": [],
        "sglang_vs_hf_fp32": {},
        "hf_bf16_vs_hf_fp32": ref16_err,
        "problems": [],
    }
    for sid in ids:
        a, b = recs.get(sid), base.get(sid)
        if a is None or b is None:
            res["problems"].append(f"sample {sid} missing")
            continue
        res["prompt_lens"].append(len(a["input_ids"]))
        if not torch.equal(a["input_ids"], b["input_ids"]):
            res["problems"].append(f"sample {sid}: input_ids differ from the reference layout")
        for j, k in enumerate(LAYERS):
            res["sglang_vs_hf_fp32"].setdefault(str(k), []).append(
                tol.rel_err(a["hidden_states"][j], b["hidden_states"][j])
            )
    fails = tol.tolerance_failures(res)
    return {
        "summary": {
            k: {"max": max(v), "mean": sum(v) / len(v)} for k, v in res["sglang_vs_hf_fp32"].items()
        },
        "tolerance_failures": fails,
    }


class Models:
    """The models of the layouts asked for, each built in the workdir on first use."""

    def __init__(self, workdir: str, report: dict):
        self.workdir, self.report, self.paths = workdir, report, {}

    def path(self, family: str) -> str:
        if family not in self.paths:
            t = time.time()
            if DEVICE["name"] == "cpu" and family == "dsv3":
                from hsdump.tiny import resolve_model_path

                # SGLang's CPU engine runs no MLA: the DeepSeek-V3 layouts debug on the tiny Llama
                self.paths[family] = resolve_model_path("tiny:llama")
            else:
                self.paths[family] = build_model(
                    os.path.join(self.workdir, f"model-{MODELS[family]['name']}"), family=family
                )
            self.report.setdefault("model_build_s", {})[family] = round(time.time() - t, 1)
        return self.paths[family]


def fidelity(
    names: List[str], workdir: str, models: Models, timeout_s: float, report: dict, save
) -> None:
    """The layouts `names`, grouped by model: extract.py runs, then the comparisons with
    transformers and with the model's reference layout."""
    runs: Dict[str, dict] = report.setdefault("layouts", {})
    for family in dict.fromkeys(model_of(n) for n in names):
        _fidelity_of_model(
            family,
            [n for n in names if model_of(n) == family],
            workdir,
            models.path(family),
            timeout_s,
            report,
            runs,
            save,
        )


def _fidelity_of_model(
    family: str,
    names: List[str],
    workdir: str,
    model: str,
    timeout_s: float,
    report: dict,
    runs: Dict[str, dict],
    save,
) -> None:
    reference = MODELS[family]["reference"]
    records: Dict[str, Dict[int, dict]] = {}
    for name in names:
        print(
            f"\n== extract.py, layout {name} ({MODELS[family]['name']}): "
            f"{' '.join(overrides(name))}",
            flush=True,
        )
        done = os.path.join(workdir, f"ds-{name}")
        if REUSE["on"] and os.path.isdir(done):  # --reuse: compare what an earlier run wrote
            res = {"rc": 0, "out_dir": done, "reused": True}
        else:
            res = run_extract(name, model, workdir, timeout_s)
        res.update(model=MODELS[family]["name"], reference=reference)
        runs[name] = res
        if res["rc"] == 0:
            res["verify"] = verify(res["out_dir"])
            records[name] = read_dataset(res["out_dir"])
            res["samples_in_dataset"] = len(records[name])
        print(json.dumps({k: v for k, v in res.items() if k != "log_tail"}, indent=1))
        if "log_tail" in res:
            print(res["log_tail"][-3000:])
        save()
    if not records:
        return
    first = records[reference] if reference in records else next(iter(records.values()))
    ids = sorted(first)
    prompts = [first[sid]["input_ids"].tolist() for sid in ids]
    t0 = time.time()
    ref32 = gc.hf_hidden_states(model, prompts, LAYERS, torch.float32, DEVICE["name"])
    ref16 = gc.hf_hidden_states(model, prompts, LAYERS, torch.bfloat16, DEVICE["name"])
    report.setdefault("reference_s", {})[family] = round(time.time() - t0, 1)
    for name, recs in records.items():
        res = compare_records(recs, ids, prompts, ref32, ref16)
        runs[name]["vs_transformers"] = {
            "summary": res["summary"],
            "tolerance_failures": res["tolerance_failures"],
            "problems": res["problems"],
        }
        if name != reference and reference in records:
            runs[name]["vs_" + reference] = compare_with(
                recs, records[reference], ids, res["hf_bf16_vs_hf_fp32"]
            )
        s = res["summary"]
        print(
            f"{name}: worst vs transformers fp32 "
            f"{max(v['sglang_max'] for v in s.values()):.4f} (HF bf16 worst "
            f"{max(v['hf_bf16_max'] for v in s.values()):.4f}); tolerance failures "
            f"{len(res['tolerance_failures'])}; vs {reference}: "
            f"{runs[name].get('vs_' + reference, {}).get('summary')}",
            flush=True,
        )
    save()


# --------------------------------------------------------------------------- throughput
THROUGHPUT_MODELS = ("dsv3", "kimi-width")


def split_layout(spec: str):
    """'tp2-dpattn@32768' -> ('tp2-dpattn', 32768); 'tp2' -> ('tp2', 16384)."""
    name, _, chunk = spec.partition("@")
    if not chunk.isdigit() and chunk:
        raise ValueError(f"{spec!r}: the chunk after '@' must be a token count, e.g. tp2@32768")
    return name, int(chunk or 16384)


def throughput_model(family: str, models: "Models", workdir: str):
    """(model path, layers, engine extras) of the throughput runs."""
    if family == "kimi-width":
        import bench  # bench/bench.py: the Kimi-width config, written as config.json only

        path = bench.build_model(
            "kimi-width", os.path.join(workdir, "model-kimi-width"), weights="dummy"
        )
        return path, bench.default_layers("kimi-width", 8), {"load_format": "dummy"}
    return models.path(family), LAYERS, {}


def throughput(
    name: str,
    model: str,
    n: int,
    length: int,
    repeat: int,
    chunk: int = 16384,
    layers: List[int] = LAYERS,
    model_extra: Optional[dict] = None,
    port: Optional[int] = 30000,
) -> dict:
    """port None: hsdump chooses it (serving.dp_attention_port under DP attention)."""
    from hsdump.capture.engine import CaptureEngine
    from hsdump.capture.layers import read_model_info
    from hsdump.config import ModelConfig

    lay = LAYOUTS[name]
    extra = dict(lay["extra"], **(model_extra or {}))  # all-reduce fusion: off by default
    # under DP attention SGLang binds TCP ports derived from `port` alone, and the caller's
    # socket of an earlier engine in this process may still hold them (seen 2026-11-30: the
    # second DP-attention engine failed with "port_base at 30234 is not available")
    if port is not None:
        extra["port"] = port
    # prefill CUDA graphs off as in conf/engine/gpu.yaml (the extract.py runs' preset)
    ecfg = gc.engine_config(
        DEVICE["name"],
        chunk,
        extra=extra,
        max_prefill_tokens=chunk,
        prefill_cuda_graph_max_tokens=0,
    )
    info = read_model_info(model)
    prompts = gc.make_prompts([length] * n, seed=1, vocab=info.vocab_size)
    t0 = time.time()
    eng = CaptureEngine(model, ModelConfig(path=model, tp_size=lay["tp"]), ecfg, layers, info)
    res = {
        "engine_start_s": round(time.time() - t0, 1),
        "prompts": n,
        "length": length,
        "chunked_prefill_size": chunk,
        "layers": list(layers),
        "runs_tokens_per_s": [],
    }
    try:
        count = {"n": 0}

        def sink(sid, ids, hs, bad):  # capture only: the rows are dropped
            count["n"] += 1

        t = time.time()
        eng.run(list(enumerate(prompts[: max(n // 8, 8)])), sink)  # warm-up (kernel JIT)
        res["warmup_s"] = round(time.time() - t, 1)
        for _ in range(repeat):
            count["n"] = 0
            t = time.time()
            eng.run(list(enumerate(prompts)), sink)
            dt = time.time() - t
            assert count["n"] == n, (count["n"], n)
            res["runs_tokens_per_s"].append(round(n * length / dt))
        res["row_sources"] = eng.sources()
        res["port"] = getattr(
            getattr(getattr(eng, "_engine", None), "server_args", None), "port", None
        )
    finally:
        eng.close()
    res["tokens_per_s"] = max(res["runs_tokens_per_s"])
    res["median_tokens_per_s"] = round(statistics.median(res["runs_tokens_per_s"]))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu: debug this script with the tiny Llama on SGLang's CPU engine",
    )
    ap.add_argument(
        "--layouts",
        default=",".join(LAYOUTS),
        help="comma list of layouts to check (default: all): " + ", ".join(LAYOUTS),
    )
    ap.add_argument(
        "--throughput-watchdog-s",
        type=float,
        default=480,
        help="abort one layout's throughput run (engine start, JIT, passes) after this",
    )
    ap.add_argument(
        "--reuse", action="store_true", help="compare the datasets an earlier run left in --workdir"
    )
    ap.add_argument(
        "--throughput",
        default="tp2-dpattn,tp2,tp2-ep2",
        help="comma list of layouts whose capture throughput is measured; "
        "layout@N runs it with N-token chunks (default 16384)",
    )
    ap.add_argument(
        "--throughput-model",
        default="dsv3",
        choices=THROUGHPUT_MODELS,
        help="dsv3: the small MoE (hidden 512); kimi-width: hidden 7168, dummy weights",
    )
    ap.add_argument(
        "--auto-port",
        action="store_true",
        help="throughput engines get no explicit port: hsdump picks one "
        "(checks that consecutive DP-attention engines in one process start)",
    )
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=None, help="results JSON")
    ap.add_argument("--extract-timeout-s", type=float, default=300)
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=0,
        help="skip throughput layouts once this much time has passed",
    )
    ap.add_argument(
        "--est-throughput-s",
        type=float,
        default=75,
        help="time one throughput layout is expected to take (for the deadline)",
    )
    args = ap.parse_args(argv)
    names = [x for x in args.layouts.split(",") if x]
    tp_specs = [x for x in args.throughput.split(",") if x]
    try:
        tp_split = [split_layout(x) for x in tp_specs]
    except ValueError as e:
        ap.error(str(e))
    unknown = [x for x in names + [n for n, _ in tp_split] if x not in LAYOUTS]
    if unknown:
        ap.error(f"unknown layouts {unknown}; use any of {', '.join(LAYOUTS)}")
    t_start = time.time()
    gc.enable_child_tracebacks()
    workdir = args.workdir or tempfile.mkdtemp(prefix="hsdump-layouts-")
    os.makedirs(workdir, exist_ok=True)
    report = LAST_REPORT
    report.clear()
    report.update(
        {
            "env": gc.environment(),
            "gpus": torch.cuda.device_count(),
            "layers": LAYERS,
            "chunked_prefill_size": CHUNK,
            "common_overrides": COMMON,
            "tolerance": {
                "mean_factor": tol.TOL_MEAN_FACTOR,
                "factor": tol.TOL_FACTOR,
                "eps": tol.TOL_EPS,
            },
        }
    )

    def save():
        report["elapsed_s"] = round(time.time() - t_start, 1)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1))

    DEVICE["name"] = args.device
    REUSE["on"] = args.reuse
    models = Models(workdir, report)
    if names:
        fidelity(names, workdir, models, args.extract_timeout_s, report, save)
    tp = report.setdefault("throughput", {})
    report["throughput_model"] = args.throughput_model
    for i, (spec, (name, chunk)) in enumerate(zip(tp_specs, tp_split)):
        left = args.deadline_s - (time.time() - t_start)
        if args.deadline_s and left < args.est_throughput_s:
            tp[spec] = {"skipped": f"deadline ({left:.0f} s left)"}
            print(f"\n== throughput {spec}: skipped (deadline)", flush=True)
            save()
            continue
        print(f"\n== throughput {spec}", flush=True)
        try:
            family = model_of(name) if args.throughput_model == "dsv3" else args.throughput_model
            # built outside the watchdog's time
            model, layers, mextra = throughput_model(family, models, workdir)
            # 480 s: on a fresh machine the first forward JIT-builds SGLang's CUDA kernels
            # (2026-11-30 on two H200s, tp2-dpattn: set_mla_kv_buffer was still building
            # after 150 s, when a 150 s watchdog aborted it; with no prefill CUDA graphs that
            # build happens in the first batch, not at engine start)
            with gc.Watchdog(args.throughput_watchdog_s, f"throughput {spec}"):
                tp[spec] = throughput(
                    name,
                    model,
                    args.prompts,
                    args.length,
                    args.repeat,
                    chunk=chunk,
                    layers=layers,
                    model_extra=mextra,
                    port=None if args.auto_port else 30000 + 1000 * i,
                )
        except Exception as e:
            tp[spec] = {
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-3000:],
            }
        print(json.dumps(tp[spec], indent=1), flush=True)
        save()
    rows = [(k, v) for k, v in tp.items() if "tokens_per_s" in v]
    if rows:
        print(
            f"\ncapture throughput ({args.throughput_model}, {args.prompts} x {args.length} "
            f"tokens per pass, rows dropped)\n| layout | chunk | engine start s | "
            f"passes tokens/s | median | best | best / {rows[0][0]} |\n|---|---:|---:|---|"
            "---:|---:|---:|"
        )
        for k, v in rows:
            print(
                f"| {k} | {v['chunked_prefill_size']} | {v['engine_start_s']} | "
                f"{', '.join(f'{x:,}' for x in v['runs_tokens_per_s'])} | "
                f"{v['median_tokens_per_s']:,} | {v['tokens_per_s']:,} | "
                f"{v['tokens_per_s'] / rows[0][1]['tokens_per_s']:.3f} |"
            )
    ok = all(
        r.get("rc") == 0
        and r.get("verify", {}).get("rc") == 0
        and not r.get("vs_transformers", {}).get("tolerance_failures", ["missing"])
        and not r.get("vs_" + reference_of(name), {}).get("tolerance_failures")
        for name, r in report.get("layouts", {}).items()
    )
    report["all_ok"] = ok
    save()
    print(f"\nall_ok={ok} elapsed {time.time() - t_start:.0f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
