"""What the GPU tests (tests/test_gpu*.py) share: their results files, the extra overrides a GPU
shared by several checks needs, extract.py and verify runs on the GPU, and a dataset's records.

Environment:
- HSDUMP_GPU_RESULTS=DIR: each test writes its measured figures there as JSON (the results
  files of docs/performance.md, "Fidelity on the GPU"); unset, nothing is written.
- HSDUMP_GPU_ENGINE='{"mem_fraction_static": 0.9, "max_total_tokens": 65536}': EngineConfig
  fields over conf/engine/gpu.yaml for the tests that start an engine in process, and
- HSDUMP_GPU_OVERRIDES='engine.mem_fraction_static=0.9 engine.max_total_tokens=65536': extract.py
  overrides added to every run, so that several checks share one GPU (SGLang sizes its KV pool
  from the memory free when the engine starts).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Dict, List

from harness import extract, python

RESULTS_ENV = "HSDUMP_GPU_RESULTS"
ENGINE_ENV = "HSDUMP_GPU_ENGINE"
OVERRIDES_ENV = "HSDUMP_GPU_OVERRIDES"


def engine_over() -> dict:
    """HSDUMP_GPU_ENGINE's EngineConfig fields ({} when unset)."""
    return json.loads(os.environ.get(ENGINE_ENV) or "{}")


def save(name: str, res: dict) -> None:
    """`res` as HSDUMP_GPU_RESULTS/NAME.json, when that is set."""
    d = os.environ.get(RESULTS_ENV)
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        (Path(d) / f"{name}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")


def offline_env() -> Dict[str, str]:
    """The hub's offline switches of this process (tests/harness.py drops HF_* variables; a GPU
    host without internet sets them)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    }


def run_extract(*overrides: str, out: Path, log: Path, timeout: float = 1500) -> int:
    """extract.py on the GPU (plus HSDUMP_GPU_OVERRIDES); its output also goes to `log`."""
    extra = shlex.split(os.environ.get(OVERRIDES_ENV, ""))
    rc, text = extract(
        *overrides,
        *extra,
        out=out,
        env={**offline_env(), "PYTHONFAULTHANDLER": "1"},
        timeout=timeout,
    )
    log.write_text(text, errors="replace")
    return rc


def verify(out: Path) -> tuple:
    """(exit status, the last lines) of `python -m hsdump verify OUT` (a GPU host may run the
    checkout without installing it)."""
    rc, text = python("-m", "hsdump", "verify", str(out), env=offline_env(), timeout=600)
    return rc, text[-1500:]


def records(out: Path) -> List[dict]:
    """Every sample of the dataset in `out`, in id order, as HsdumpDataset.get gives it."""
    from hsdump.store.reader import HsdumpDataset

    ds = HsdumpDataset(str(out))
    try:
        return [ds.get(sid) for sid in sorted(ds.ids)]
    finally:
        ds.close()


# --------------------------------------------------------------------------- two GPUs
LAYOUT_LAYERS = [1, 3, 4]  # Kimi-K2.5's preset [3, 31, 59] of L = 61 scaled to L = 6
CHUNK = 128
COMMON = [  # every layout's extract.py overrides (the GPU preset keeps FlashInfer's fusion off)
    "engine=gpu",
    "engine.mem_fraction_static=0.5",
    f"engine.chunked_prefill_size={CHUNK}",
    f"capture.layers=[{','.join(map(str, LAYOUT_LAYERS))}]",
    "output.overwrite=true",
]
LAYOUT_MODELS = {  # hsdump.testing.models' name, and the layout each one is compared with
    "dsv3": {"name": "dsv3-small", "reference": "tp1"},
    "llama": {"name": "llama-small", "reference": "llama-tp1"},
}
LAYOUTS = {
    "tp1": {"tp": 1, "extra": {}, "model": "dsv3"},
    "tp2": {"tp": 2, "extra": {}, "model": "dsv3"},
    "tp2-dpattn": {"tp": 2, "extra": {"dp_size": 2, "enable_dp_attention": True}, "model": "dsv3"},
    "tp2-ep2": {"tp": 2, "extra": {"ep_size": 2}, "model": "dsv3"},
    "llama-tp1": {"tp": 1, "extra": {}, "model": "llama"},
    "llama-tp2": {"tp": 2, "extra": {}, "model": "llama"},
}
ROW_SOURCES = re.compile(r"captured rows came from (\d+) scheduler process\(es\): (.*)")


def layout_overrides(name: str) -> List[str]:
    lay = LAYOUTS[name]
    out = [f"model.tp_size={lay['tp']}"]
    for k, v in lay["extra"].items():
        out.append(f"+engine.extra.{k}={str(v).lower() if isinstance(v, bool) else v}")
    return out


def layout_model(family: str, workdir: Path) -> str:
    """The layouts' checkpoint of `family` (dsv3, llama): random weights with the DeepSeek
    tokenizer (its vocabulary) and hsdump's DeepSeek-V3 template, built once in workdir."""
    from hsdump.testing import models

    name = LAYOUT_MODELS[family]["name"]
    return models.build(name, workdir / f"model-{name}", tokenizer=True)


def row_sources(log: str) -> tuple:
    """(how many scheduler processes sent rows, their names) from a run's log."""
    m = ROW_SOURCES.search(log)
    return (int(m.group(1)), m.group(2).strip()) if m else (None, "")


def against(recs: List[dict], base: List[dict], scale: Dict[str, list]) -> dict:
    """Each stored tensor against the same sample's of another dataset (`base`, in place of
    transformers float32), judged by rule 2 with transformers' bf16 errors `scale` ({layer:
    [per sample]}): {"worst": {layer: max}, "failures": [...]}."""
    from hsdump import check

    res = {"sglang_vs_hf_fp32": {}, "hf_bf16_vs_hf_fp32": scale, "prompt_lens": [], "problems": []}
    if [r["id"] for r in recs] != [b["id"] for b in base]:
        res["problems"].append("the two datasets hold other samples")
    for a, b in zip(recs, base):
        res["prompt_lens"].append(len(a["input_ids"]))
        if a["input_ids"].tolist() != b["input_ids"].tolist():
            res["problems"].append(f"sample {a['id']}: input_ids differ")
        for j, k in enumerate(LAYOUT_LAYERS):
            err = check.rel_err(a["hidden_states"][j], b["hidden_states"][j])
            res["sglang_vs_hf_fp32"].setdefault(str(k), []).append(err)
    worst = {k: max(v) for k, v in res["sglang_vs_hf_fp32"].items()}
    return {"worst": worst, "failures": check.tolerance_failures(res)}


def failures(layers, moe: bool) -> List[str]:
    """What hsdump.check found wrong in the compared layers (LayerResult). For an MoE model, not
    the neighbour margin: its rows must still be closest to their own index and within rule 2,
    but a tiny random MoE's bf16 error is too large against its adjacent layers' distance for
    the 5x margin (the 61-layer Kimi checkpoint, its own bf16 rows as the captured ones, on the
    CPU 2026-12-03: layer 31's error 0.064 against 0.19-0.23 to layers 30 and 32; DeepSeek-V3's
    worst MoE sample on the GPU, 0.16, against adjacent layers 0.54 apart)."""
    out = [f for r in layers for f in r.failures]
    return [f for f in out if not f.startswith("neighbour")] if moe else out
