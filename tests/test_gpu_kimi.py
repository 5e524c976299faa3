"""Kimi-K2.5 as its checkpoint is (bench/kimi_check.py, run as that script): a tiny
KimiK25ForConditionalGeneration in the real layout with Kimi's tiktoken tokenizer files, bf16
and with compressed-tensors INT4 routed experts, through `extract.py model=kimi_k25 engine=gpu
model.tp_size=1 model.path=<it> dataset.max_samples=50` and nothing else; verify clean, layers
[3, 31, 59] against transformers float32 on the same (dequantized) weights by the MoE rule of
tests/tolerance.py.

Run on the GPU machine: python3 -m pytest -q -s tests/test_gpu_kimi.py
"""

import json
import subprocess
import sys

import pytest
import torch
from factories import ROOT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)"),
]


@pytest.mark.parametrize("int4", [False, True], ids=["bf16", "int4"])
def test_kimi_k25_checkpoint_through_the_preset(int4, tmp_path):
    out = tmp_path / "kimi.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "kimi_check.py"),
            *(["--int4"] if int4 else []),
            "--workdir",
            str(tmp_path),
            "--out",
            str(out),
        ],
        cwd=ROOT,
    )
    assert out.exists(), "bench/kimi_check.py wrote no results (its output is above)"
    res = json.loads(out.read_text())["runs"][0]
    print({k: v for k, v in res.items() if k != "log_tail"})
    assert res["extract_rc"] == 0, res.get("log_tail")
    assert res["verify_rc"] == 0, res["verify"]
    assert res["layers"] == [3, 31, 59] and res["samples"] > 40
    assert res["status"] == "ok", res.get("failures")
