"""Serving layouts on two GPUs: a DeepSeek-V3-architecture model and a Llama through extract.py.

Layouts (tests/gpu.py's LAYOUTS) of the DeepSeek-V3 model (hsdump.testing.models' dsv3-small:
real MLA dims, 8 experts top-2, hidden 512, 6 layers): TP 1 (reference), TP 2, TP 2 + DP
attention (dp_size=2, enable_dp_attention) and TP 2 + EP 2; of the Llama (llama-small): TP 1
(its reference) and TP 2. Both carry the DeepSeek tokenizer. Each run writes the embedded 100
conversations (99 samples) at layers [1, 3, 4] with 128-token chunked prefill (64 per rank
under DP attention), so requests span chunks and DP ranks sit idle while others prefill. Every
stored tensor must match transformers float32 (hsdump.check: the MoE rule, and every sample's
rows closest to their own index) and its model's TP 1 dataset by the same rule, `hsdump verify` must be clean, and the
rows must come from the processes the layout says: one (attention-TP rank 0) under TP, one per
DP group under DP attention.

Run on a 2-GPU machine: python3 -m pytest -q -s tests/test_gpu_layouts.py
HSDUMP_GPU_LAYOUTS=llama-tp1,llama-tp2 (a comma list) runs only those layouts (with their
references) and skips the others; HSDUMP_GPU_RESULTS writes gpu-layouts.json (tests/gpu.py).
The layouts' capture throughput is a benchmark: bench/layouts_bench.py.
"""

import os

import pytest
import torch
from gpu import (
    COMMON,
    LAYOUT_LAYERS,
    LAYOUT_MODELS,
    LAYOUTS,
    against,
    failures,
    layout_model,
    layout_overrides,
    records,
    row_sources,
    run_extract,
    save,
    verify,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 NVIDIA GPUs (CUDA)"),
]


def reference_of(name: str) -> str:
    """The layout whose dataset `name`'s is compared with (its model's TP 1)."""
    return LAYOUT_MODELS[LAYOUTS[name]["model"]]["reference"]


def selected() -> list:
    """The layouts this run checks: HSDUMP_GPU_LAYOUTS plus their references (default all)."""
    want = [x for x in os.environ.get("HSDUMP_GPU_LAYOUTS", "").split(",") if x]
    if not want:
        return list(LAYOUTS)
    want += [reference_of(x) for x in want if x in LAYOUTS]
    return [x for x in LAYOUTS if x in want]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Every selected layout through extract.py, verified and compared (model by model)."""
    from hsdump import check

    work = tmp_path_factory.mktemp("layouts")
    runs = {}
    for family, m in LAYOUT_MODELS.items():
        names = [n for n in selected() if LAYOUTS[n]["model"] == family]
        if not names:
            continue
        model = layout_model(family, work)
        recs = {}
        for name in names:
            out, log = work / f"ds-{name}", work / f"extract-{name}.log"
            rc = run_extract(
                f"model.path={model}",
                f"model.name={m['name']}",
                *COMMON,
                *layout_overrides(name),
                out=out,
                log=log,
            )
            r = runs[name] = {"rc": rc, "reference": m["reference"]}
            r["n_row_sources"], r["row_sources"] = row_sources(log.read_text(errors="replace"))
            if rc != 0:
                r["log_tail"] = log.read_text(errors="replace")[-3000:]
                continue
            r["verify_rc"], r["verify"] = verify(out)
            recs[name] = records(out)
            r["samples_in_dataset"] = len(recs[name])
        if not recs:
            continue
        first = recs.get(m["reference"]) or next(iter(recs.values()))
        prompts = [x["input_ids"].tolist() for x in first]
        ref = check.reference(model, prompts, device="cuda")
        for name, rs in recs.items():
            layers = check.compare_layers(LAYOUT_LAYERS, rs, ref, moe=True)
            runs[name]["vs_transformers"] = [x.to_dict() for x in layers]
            runs[name]["failures"] = failures(layers, moe=True)
            if name != m["reference"] and m["reference"] in recs:
                scale = {str(x.index): x.hf_bf16 for x in layers}
                runs[name]["vs_" + m["reference"]] = against(rs, recs[m["reference"]], scale)
    save("gpu-layouts", {"layouts": runs, "common_overrides": COMMON})
    return runs


# the module's extractions run in the first test's setup: the four DeepSeek-V3 runs alone take
# about 8 minutes on a fresh host (docs/performance.md, "Serving layouts on two H200s")
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_transformers_and_tp1(layout, report):
    if layout not in selected():
        pytest.skip(f"{layout} is not in HSDUMP_GPU_LAYOUTS")
    r = report[layout]
    ref = reference_of(layout)
    assert r["reference"] == ref
    assert r["rc"] == 0, r.get("log_tail", "")
    assert r["samples_in_dataset"] == 99
    assert r["verify_rc"] == 0, r["verify"]
    assert not r["failures"], "\n".join(r["failures"][:10])
    if layout != ref:  # against its model's TP 1 (tp1 or llama-tp1)
        assert not r["vs_" + ref]["failures"], r["vs_" + ref]
    # rows come from attention-TP rank 0 of each DP group: two groups under DP attention
    want = 2 if LAYOUTS[layout]["extra"].get("enable_dp_attention") else 1
    assert r["n_row_sources"] == want, r["row_sources"]
