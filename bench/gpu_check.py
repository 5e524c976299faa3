"""Fidelity check of hsdump's captured hidden states against a transformers forward pass.

For each case: build a tiny random model with transformers (bf16 weights, saved to a temp
folder), capture `layers` (hf_hidden_states_index convention) for prompts of several lengths
with hsdump's `CaptureEngine`, write them with `DatasetWriter`, read them back with
`HsdumpDataset`, and compare every stored tensor with transformers' `output_hidden_states`
`hidden_states[k]` computed in float32 from the same weights. The scale reference is
transformers itself in bf16 against transformers in float32 on the same inputs.

    python3 bench/gpu_check.py --out results.json              # on a GPU (SGLang 0.5.17 bundle)
    python3 bench/gpu_check.py --device cpu --cases llama      # debug on the CPU (SGLang 0.5.23)

tests/test_gpu.py runs the same cases through pytest (this script, one case per test); the
tolerance rule is tests/tolerance.py's, imported from there.
Relative error of a sample and a layer is ||a - b|| / ||b|| over the whole [seq, hidden] tensor.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402

# the tolerance rule: tests/tolerance.py (its numbers, the reasons for them, the measurements)
from tolerance import TOL_EPS, TOL_FACTOR, TOL_MEAN_FACTOR, rel_err, tolerance_failures  # noqa: E402

PROMPT_LENS = (7, 33, 200, 1000)
VOCAB = 32000
NUM_LAYERS = 6
# [1, 3, 5]: every other layer up to the last capturable one (L - 1); plus the Kimi-K2.5
# preset [3, 31, 59] of L = 61 scaled to L = 6 -> [1, 3, 4]. Given unsorted on purpose, so the
# test also covers hsdump's reordering of the aux rows (which SGLang concatenates sorted).
LAYERS = [1, 3, 5, 4]


# --------------------------------------------------------------------------- hang guard
def _sglang_children() -> List[int]:
    """PIDs of this process's descendants, minus multiprocessing's resource tracker."""
    try:
        import psutil

        out = []
        for p in psutil.Process().children(recursive=True):
            try:
                if "resource_tracker" not in " ".join(p.cmdline()):
                    out.append(p.pid)
            except psutil.Error:
                pass
        return out
    except ImportError:
        return []


class Watchdog:
    """If a block runs past `seconds`: dump this process's stacks, then SIGABRT every SGLang
    child (with PYTHONFAULTHANDLER=1, set by `enable_child_tracebacks`, each prints its own
    Python stacks as it dies), so a hung engine turns into an error instead of a lost run."""

    def __init__(self, seconds: float, label: str):
        self.seconds, self.label, self.fired = seconds, label, False
        self._timer: Optional[threading.Timer] = None

    def _fire(self):
        self.fired = True
        print(
            f"\n[watchdog] {self.label}: still running after {self.seconds:.0f} s; stacks "
            "follow, then the SGLang children are aborted",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for pid in _sglang_children():
            try:
                os.kill(pid, signal.SIGABRT)
            except OSError:
                pass

    def __enter__(self):
        if self.seconds and self.seconds > 0:
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc):
        if self._timer is not None:
            self._timer.cancel()


def enable_child_tracebacks() -> None:
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")  # inherited by SGLang's spawned processes


# --------------------------------------------------------------------------- models
def llama_config(num_layers: int = NUM_LAYERS):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )


def deepseek_v3_config(num_layers: int = NUM_LAYERS, hidden: int = 512):
    """DeepSeek-V3 / Kimi-K2 architecture with the real model's MLA dims (the triton MLA
    kernels of SGLang 0.5.17 do not compile for smaller ones) and a small MoE."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        max_position_embeddings=163840,
        rope_scaling={
            "type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "rope_theta": 10000.0,
        },
        # keys of the real DeepSeek-V3 / Kimi-K2 config.json that SGLang's deepseek_v2 reads and
        # transformers' DeepseekV3Config does not define (kept as extra keys in config.json)
        moe_layer_freq=1,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        ep_size=1,
        seq_aux=True,
        aux_loss_alpha=0.001,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )


CONFIGS = {"llama": llama_config, "deepseek_v3": deepseek_v3_config}


def make_model(family: str, dest: str, seed: int = 0, **kw) -> str:
    """Random bf16 weights saved with `save_pretrained` (config.json + model.safetensors)."""
    from transformers import AutoModelForCausalLM

    if (Path(dest) / "config.json").exists():
        return dest
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(CONFIGS[family](**kw), dtype=torch.bfloat16)
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    os.replace(tmp, dest)
    return dest


def make_prompts(lens: Sequence[int] = PROMPT_LENS, seed: int = 0, vocab: int = VOCAB):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lens]


# --------------------------------------------------------------------------- reference
@torch.no_grad()
def hf_hidden_states(
    model_path: str,
    prompts: List[List[int]],
    indices: Sequence[int],
    dtype: torch.dtype,
    device: str,
) -> List[Dict[int, torch.Tensor]]:
    """transformers' `hidden_states[k]` (float32, on the CPU) for each prompt, run one by one."""
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    out = []
    for ids in prompts:
        hs = model.model(
            input_ids=torch.tensor([ids], device=device), output_hidden_states=True
        ).hidden_states
        out.append({k: hs[k][0].float().cpu() for k in indices})
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


# --------------------------------------------------------------------------- capture
def engine_config(device: str, chunked_prefill_size: int = -1, **over):
    """conf/engine/gpu.yaml (mem_fraction_static lowered to 0.5) or conf/engine/cpu.yaml.

    `GPU_CHECK_ENGINE` (a JSON object of EngineConfig fields) overrides both, e.g.
    '{"mem_fraction_static": 0.9, "max_total_tokens": 65536}' so that several checks share one
    GPU (bench/gpu_stack/run-0523.sh `together`): SGLang sizes its KV pool from the memory free
    when the engine starts, so each engine's pool must be capped for others to fit beside it."""
    from hsdump.config import EngineConfig

    if device == "cpu":
        kw = dict(
            device="cpu",
            attention_backend="torch_native",
            sampling_backend="pytorch",
            mem_fraction_static=0.3,
            max_total_tokens=8192,
            max_running_requests=16,
            max_prefill_tokens=4096,
            inflight_tokens=8192,
            disable_cuda_graph=True,
        )
    else:
        kw = dict(
            device="cuda",
            attention_backend="triton",
            sampling_backend="pytorch",
            mem_fraction_static=0.5,
            max_prefill_tokens=16384,
            inflight_tokens=131072,
            disable_cuda_graph=False,
        )
    kw["chunked_prefill_size"] = chunked_prefill_size
    kw.update(over)
    kw.update(json.loads(os.environ.get("GPU_CHECK_ENGINE") or "{}"))
    return EngineConfig(**kw)


def capture(
    model_path: str, layers: Sequence[int], prompts: List[List[int]], out_dir: str, ecfg
) -> dict:
    """CaptureEngine -> DatasetWriter -> HsdumpDataset. Returns the records by sample id and
    timings. Must be called from `if __name__ == "__main__":` code (SGLang spawns)."""
    from hsdump.capture.engine import CaptureEngine
    from hsdump.capture.layers import CONVENTION, read_model_info
    from hsdump.config import ModelConfig
    from hsdump.store.layout import FORMAT
    from hsdump.store.layout import VERSION as FORMAT_VERSION
    from hsdump.store.reader import HsdumpDataset
    from hsdump.store.writer import DatasetWriter

    info = read_model_info(model_path)
    layers = list(layers)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "layers": layers,
        "convention": CONVENTION,
        "storage_dtype": "bfloat16",
        "model": {
            "path": model_path,
            "architecture": info.architecture,
            "hidden_size": info.hidden_size,
            "num_hidden_layers": info.num_hidden_layers,
        },
    }
    compat = {"model": model_path, "layers": layers}
    writer = DatasetWriter(
        out_dir, manifest, compat, layers=layers, hidden_size=info.hidden_size, overwrite=True
    )
    t0 = time.time()
    eng = CaptureEngine(model_path, ModelConfig(path=model_path), ecfg, layers, info)
    t1 = time.time()
    try:
        eng.run(
            list(enumerate(prompts)),
            lambda sid, ids, hs, bad: writer.add(sid, ids, [1] * len(ids), hs, nonfinite=bad),
        )
        t2 = time.time()
    finally:
        try:
            eng.close()
        finally:
            writer.close()
    ds = HsdumpDataset(out_dir)
    assert ds.layers == layers, (ds.layers, layers)
    records = {sid: ds.get(sid) for sid in ds.ids}
    return {
        "records": records,
        "engine_start_s": t1 - t0,
        "capture_s": t2 - t1,
        "sglang": eng.version,
    }


def compare(records: dict, prompts, layers, ref32, ref16) -> dict:
    """Per layer, per prompt: sglang-vs-fp32 and hf-bf16-vs-fp32 relative errors."""
    res = {
        "layers": list(layers),
        "prompt_lens": [len(p) for p in prompts],
        "sglang_vs_hf_fp32": {},
        "hf_bf16_vs_hf_fp32": {},
        "problems": [],
    }
    for sid, ids in enumerate(prompts):
        rec = records.get(sid)
        if rec is None:
            res["problems"].append(f"sample {sid} missing from the dataset")
            continue
        if rec["input_ids"].tolist() != ids:
            res["problems"].append(f"sample {sid}: stored input_ids differ from the prompt")
        for j, k in enumerate(layers):
            h = rec["hidden_states"][j]
            if tuple(h.shape) != tuple(ref32[sid][k].shape):
                res["problems"].append(
                    f"sample {sid} layer {k}: shape {tuple(h.shape)} != "
                    f"{tuple(ref32[sid][k].shape)}"
                )
                continue
            res["sglang_vs_hf_fp32"].setdefault(str(k), []).append(rel_err(h, ref32[sid][k]))
            res["hf_bf16_vs_hf_fp32"].setdefault(str(k), []).append(
                rel_err(ref16[sid][k], ref32[sid][k])
            )
    return res


def run_case(
    family: str,
    workdir: str,
    device: str = "cuda",
    chunked_prefill_size: int = -1,
    layers: Sequence[int] = LAYERS,
    lens: Sequence[int] = PROMPT_LENS,
    ref_cache: Optional[dict] = None,
    extra: Optional[dict] = None,
) -> dict:
    """Build (or reuse) the model in workdir, capture, compare. Returns a JSON-able dict.
    `extra`: further sglang.Engine kwargs (EngineConfig.extra)."""
    model_path = make_model(family, os.path.join(workdir, f"model-{family}"))
    prompts = make_prompts(lens)
    ecfg = engine_config(device, chunked_prefill_size, extra=dict(extra or {}))
    tag = "-".join(f"{k}" for k in sorted(extra or {}))
    cap = capture(
        model_path,
        layers,
        prompts,
        os.path.join(workdir, f"ds-{family}-chunk{chunked_prefill_size}{tag}"),
        ecfg,
    )
    key = (family, tuple(lens), tuple(layers))
    if ref_cache is not None and key in ref_cache:
        ref32, ref16 = ref_cache[key]
    else:
        ref_dev = "cuda" if device == "cuda" else "cpu"
        ref32 = hf_hidden_states(model_path, prompts, layers, torch.float32, ref_dev)
        ref16 = hf_hidden_states(model_path, prompts, layers, torch.bfloat16, ref_dev)
        if ref_cache is not None:
            ref_cache[key] = (ref32, ref16)
    res = compare(cap["records"], prompts, layers, ref32, ref16)
    res.update(
        family=family,
        device=device,
        chunked_prefill_size=chunked_prefill_size,
        extra=dict(extra or {}),
        engine_start_s=round(cap["engine_start_s"], 1),
        capture_s=round(cap["capture_s"], 1),
        sglang=cap["sglang"],
        records=cap["records"],
    )
    return res


def summarize(res: dict) -> dict:
    """Max and mean over prompts per layer, for the report."""
    out = {}
    for k in res.get("sglang_vs_hf_fp32", {}):
        a, b = res["sglang_vs_hf_fp32"][k], res["hf_bf16_vs_hf_fp32"][k]
        out[k] = {
            "sglang_max": max(a),
            "hf_bf16_max": max(b),
            "sglang_mean": sum(a) / len(a),
            "hf_bf16_mean": sum(b) / len(b),
        }
    return out


def environment() -> dict:
    from importlib import metadata

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
    }
    for pkg in ("sglang", "sglang-kernel", "torch", "transformers", "triton", "safetensors"):
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    if os.environ.get("GPU_CHECK_ENGINE"):
        env["GPU_CHECK_ENGINE"] = os.environ["GPU_CHECK_ENGINE"]
    return env


def _print_case(name: str, res: dict) -> None:
    print(
        f"\n== {name}: {res.get('family')} chunked_prefill_size="
        f"{res.get('chunked_prefill_size')} (engine start {res.get('engine_start_s')} s, "
        f"capture {res.get('capture_s')} s)"
    )
    print("   layer | prompt lens " + " ".join(f"{n:>7d}" for n in res["prompt_lens"]))
    for k in res["sglang_vs_hf_fp32"]:
        print(
            f"   {k:>5} | sglang     " + " ".join(f"{e:7.4f}" for e in res["sglang_vs_hf_fp32"][k])
        )
        print(
            f"   {'':>5} | hf bf16    "
            + " ".join(f"{e:7.4f}" for e in res["hf_bf16_vs_hf_fp32"][k])
        )
    if "vs_unchunked" in res:
        for k, errs in res["vs_unchunked"].items():
            print(f"   {k:>5} | vs unchunk " + " ".join(f"{e:7.4f}" for e in errs))
    for p in res.get("problems", []):
        print("   PROBLEM:", p)
    fails = tolerance_failures(res)
    print(
        f"   tolerance (mean <= {TOL_MEAN_FACTOR} x hf-bf16 mean + {TOL_EPS}, each <= "
        f"{TOL_FACTOR} x hf-bf16 max + {TOL_EPS}): "
        + ("OK" if not fails else f"{len(fails)} FAILED: " + "; ".join(fails[:6]))
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--cases",
        default="llama,deepseek_v3,llama@256,deepseek_v3@256",
        help="comma list of FAMILY[@CHUNKED_PREFILL_SIZE][+nopg]; +nopg adds "
        "disable_prefill_cuda_graph=True (SGLang >= 0.5.17 captures prefill CUDA "
        "graphs up to the chunk size, and up to 2048 tokens for MLA models)",
    )
    ap.add_argument(
        "--case-timeout-s",
        type=float,
        default=300,
        help="abort a case's SGLang processes after this long (0: never)",
    )
    ap.add_argument("--workdir", default=None, help="models and datasets (default: a temp dir)")
    ap.add_argument("--out", default=None, help="write the results JSON here")
    ap.add_argument("--lens", default=",".join(map(str, PROMPT_LENS)))
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=0,
        help="skip the remaining cases once this much time has passed",
    )
    args = ap.parse_args(argv)
    t_start = time.time()
    workdir = args.workdir or tempfile.mkdtemp(prefix="hsdump-gpucheck-")
    os.makedirs(workdir, exist_ok=True)
    lens = [int(x) for x in args.lens.split(",")]
    report = {
        "env": environment(),
        "device": args.device,
        "layers": LAYERS,
        "tolerance": {"mean_factor": TOL_MEAN_FACTOR, "factor": TOL_FACTOR, "eps": TOL_EPS},
        "cases": {},
    }
    refs: dict = {}
    records_by_family: dict = {}
    all_ok = True

    def save():
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1))

    enable_child_tracebacks()
    for case in [c for c in args.cases.split(",") if c]:
        spec, _, flags = case.partition("+")
        family, _, chunk = spec.partition("@")
        chunk_size = int(chunk) if chunk else -1
        extra = {"disable_prefill_cuda_graph": True} if "nopg" in flags.split("+") else {}
        if args.deadline_s and time.time() - t_start > args.deadline_s:
            report["cases"][case] = {"skipped": "deadline"}
            print(f"\n== {case}: skipped (deadline)")
            save()
            continue
        try:
            with Watchdog(args.case_timeout_s, case):
                res = run_case(
                    family, workdir, args.device, chunk_size, lens=lens, ref_cache=refs, extra=extra
                )
            recs = res.pop("records")
            if chunk_size == -1 and not extra:
                records_by_family[family] = recs
            elif family in records_by_family:  # chunked vs unchunked, same engine settings else
                base = records_by_family[family]
                res["vs_unchunked"] = {
                    str(k): [
                        rel_err(recs[s]["hidden_states"][j], base[s]["hidden_states"][j])
                        for s in sorted(recs)
                    ]
                    for j, k in enumerate(res["layers"])
                }
            res["tolerance_failures"] = tolerance_failures(res)
            res["summary"] = summarize(res)
            all_ok &= not res["tolerance_failures"]
            report["cases"][case] = res
            _print_case(case, res)
        except Exception as e:  # keep going: later cases still tell something
            all_ok = False
            report["cases"][case] = {
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-4000:],
            }
            print(f"\n== {case}: ERROR\n{traceback.format_exc()}")
        report["elapsed_s"] = round(time.time() - t_start, 1)
        save()
    report["all_ok"] = all_ok
    save()
    print(f"\nall_ok={all_ok} elapsed {time.time() - t_start:.0f} s")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
