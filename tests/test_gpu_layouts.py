"""Serving layouts on two GPUs: DeepSeek-V3 architecture and Llama through extract.py
(bench/gpu_layouts.py, run as that script; its layout table read from its source).

DeepSeek-V3: TP 1 (reference), TP 2, TP 2 + DP attention (dp_size=2, enable_dp_attention) and
TP 2 + EP 2; Llama: TP 1 (its reference) and TP 2. Each writes the embedded 100 conversations
(99 samples) with 128-token chunked prefill; every stored tensor must match transformers
float32 by the project's tolerance rule (tests/tolerance.py) and its model's TP 1 dataset by
the same rule, `python -m hsdump verify` must be clean, and the rows must come from the
processes the layout says: one (attention-TP rank 0) under TP, one per DP group under DP
attention.

Run on the 2-GPU machine (SGLang 0.5.17 bundle and the extract.py wheels, see
bench/README.md, "Serving layouts on two H200s"): python3 -m pytest -q -s tests/test_gpu_layouts.py
HSDUMP_GPU_LAYOUTS_JSON=path writes the results; HSDUMP_GPU_LAYOUTS_THROUGHPUT=1 adds the
capture-throughput comparison of the three DeepSeek-V3 TP 2 layouts;
HSDUMP_GPU_LAYOUTS=llama-tp1,llama-tp2 (a comma list) runs only those layouts (with their
references) and skips the tests of the others.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from factories import ROOT, bench_literal

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 NVIDIA GPUs (CUDA)"),
]

LAYOUT_TABLE = bench_literal("gpu_layouts", "LAYOUTS")
MODELS = bench_literal("gpu_layouts", "MODELS")
LAYOUTS = list(LAYOUT_TABLE)


def reference_of(name: str) -> str:
    """The layout whose dataset `name`'s is compared with (its model's TP 1), as
    bench/gpu_layouts.py's reference_of says."""
    return MODELS[LAYOUT_TABLE[name]["model"]]["reference"]


def selected() -> list:
    """The layouts this run checks: HSDUMP_GPU_LAYOUTS plus their references (default all)."""
    want = [x for x in os.environ.get("HSDUMP_GPU_LAYOUTS", "").split(",") if x]
    if not want:
        return LAYOUTS
    want += [reference_of(x) for x in want if x in LAYOUT_TABLE]
    return [x for x in LAYOUTS if x in want]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    argv = [
        "--workdir",
        str(tmp_path_factory.mktemp("layouts")),
        "--layouts",
        ",".join(selected()),
        "--throughput",
        "tp2-dpattn,tp2,tp2-ep2" if os.environ.get("HSDUMP_GPU_LAYOUTS_THROUGHPUT") else "",
    ]
    if os.environ.get("HSDUMP_GPU_LAYOUTS_DEADLINE_S"):
        argv += ["--deadline-s", os.environ["HSDUMP_GPU_LAYOUTS_DEADLINE_S"]]
    out = os.environ.get("HSDUMP_GPU_LAYOUTS_JSON") or str(
        tmp_path_factory.mktemp("layouts-report") / "gpu-layouts.json"
    )
    argv += ["--out", out]
    subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_layouts.py"), *argv], cwd=ROOT)
    return json.loads(Path(out).read_text())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_matches_transformers_and_tp1(layout, report):
    if layout not in selected():
        pytest.skip(f"{layout} is not in HSDUMP_GPU_LAYOUTS")
    r = report["layouts"][layout]
    ref = reference_of(layout)
    assert r["reference"] == ref
    assert r["rc"] == 0, r.get("log_tail", "")[-3000:]
    assert r["samples_in_dataset"] == 99
    assert r["verify"]["rc"] == 0, r["verify"]["tail"]
    fid = r["vs_transformers"]
    assert not fid["problems"] and not fid["tolerance_failures"], fid
    if layout != ref:  # against its model's TP 1 (tp1 or llama-tp1)
        assert not r["vs_" + ref]["tolerance_failures"], r["vs_" + ref]
    # rows come from attention-TP rank 0 of each DP group: two groups under DP attention
    want = 2 if LAYOUT_TABLE[layout]["extra"].get("enable_dp_attention") else 1
    assert r["n_row_sources"] == want, r["row_sources"]


@pytest.mark.skipif(
    not os.environ.get("HSDUMP_GPU_LAYOUTS_THROUGHPUT"),
    reason="HSDUMP_GPU_LAYOUTS_THROUGHPUT=1 runs the throughput comparison",
)
def test_throughput_of_the_tp2_layouts(report):
    for name, r in report["throughput"].items():
        assert "error" not in r, (name, r)
