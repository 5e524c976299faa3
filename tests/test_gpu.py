"""Fidelity of hsdump's captured hidden states on a GPU, against transformers in float32.

The cases of bench/gpu_check.py, run as that script (one case, one engine, per test): tiny
random Llama and DeepSeek-V3 (MLA + MoE) models, prompts of 7, 33, 200 and 1000 tokens, layers
[1, 3, 5, 4] in the hf_hidden_states_index convention, captured with CaptureEngine, written
with DatasetWriter and read back with HsdumpDataset; its results JSON is judged here.

Tolerance (tests/tolerance.py, the MoE rule), per layer, against transformers' own bf16-vs-
float32 error on the same prompts (a bf16 engine cannot be closer to float32 than bf16
arithmetic allows): the mean over prompts of SGLang's error must be <= 2x the mean HF-bf16
error + 0.005, and every prompt's error <= 3x the largest HF-bf16 error at that layer + 0.005.
A wrong or shifted layer, a lost chunk or another request's rows give errors far above that
(adjacent layers of these models differ by 0.54-4.1 relative, measured in float32). Per-prompt
ratios are not used because MoE routing flips on near-ties in either bf16 run
(tests/tolerance.py, docs/performance.md, "Fidelity on the GPU"; measured on an H200: Llama 0.004-0.006 vs HF-bf16
0.004-0.006, DeepSeek-V3 MoE layers 0.035-0.083 vs HF-bf16 0.008-0.083).

Run on the GPU machine: python3 -m pytest -q tests/test_gpu.py   (or bench/gpu_check.py)
"""

import json
import subprocess
import sys

import pytest
import torch
from factories import ROOT, bench_literal
from tolerance import tolerance_failures

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)"),
]

PROMPT_LENS = bench_literal("gpu_check", "PROMPT_LENS")
LAYERS = bench_literal("gpu_check", "LAYERS")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu_check")  # the models, built once, shared by the cases


def run_case(case: str, workdir) -> dict:
    """`bench/gpu_check.py --cases CASE` on the GPU (no watchdog); that case's result."""
    out = workdir / f"{case}.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_check.py"),
            "--device",
            "cuda",
            "--cases",
            case,
            "--case-timeout-s",
            "0",
            "--workdir",
            str(workdir),
            "--out",
            str(out),
        ],
        cwd=ROOT,
    )
    assert out.exists(), "bench/gpu_check.py wrote no results (its output is above)"
    res = json.loads(out.read_text())["cases"][case]
    assert "error" not in res, res.get("traceback", res["error"])
    return res


def _check(res):
    # the measured errors, for the record (run with -s to see them)
    for k, errs in sorted(res.get("sglang_vs_hf_fp32", {}).items()):
        ref = res["hf_bf16_vs_hf_fp32"][k]
        print(
            f"layer {k}: hsdump worst {max(errs):.4f} mean {sum(errs) / len(errs):.4f} | "
            f"hf bf16 worst {max(ref):.4f} mean {sum(ref) / len(ref):.4f}"
        )
    msg = "\n".join(res.get("problems", []) + tolerance_failures(res))
    assert not tolerance_failures(res), msg


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_fidelity(family, workdir):
    res = run_case(family, workdir)
    assert res["prompt_lens"] == list(PROMPT_LENS)
    assert sorted(res["sglang_vs_hf_fp32"]) == sorted(str(k) for k in LAYERS)
    _check(res)


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_chunked_prefill(family, workdir):
    # 256-token chunks: the 1000-token prompt spans 4 chunks and the short prompts are split
    # to fill chunks; every row must still arrive, in order, at the right layer.
    res = run_case(f"{family}@256", workdir)
    _check(res)
