"""The in-run final-state check (`check.logprob_samples`, hsdump.check_final) on the GPU, for an
MoE class at its preset's settings: the tiny Kimi-K2.5 checkpoint of tests/kimi_checkpoint.py
(KimiK25ForConditionalGeneration around a 61-layer DeepSeek-V3 MoE text model, bf16), through

    extract.py model=kimi_k25 engine=gpu model.tp_size=1 model.path=<it> dataset.max_samples=8 \
        capture.final=[post_norm] check.logprob_samples=4

SGLang's own input-token logprobs of four samples against the loss from the captured post-norm
final state through the checkpoint's LM head read from its safetensors (the model is not loaded a
second time). The run's final_check/main.json must say ok for every sample, and the engine's loss
must be a real one (finite, not zero). The CPU side (the rule, the checkpoint head against
transformers, a failing verdict) is tests/test_check.py and tests/test_pipeline.py.

Run on a GPU machine: python3 -m pytest -q -s tests/test_gpu_final_check.py (HSDUMP_GPU_RESULTS
writes final-check-kimi.json).
"""

import json
import math
import time

import pytest
import torch
from gpu import run_extract, save, verify
from kimi_checkpoint import preset_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)"),
]


def test_final_check_in_run_kimi_k25(tmp_path):
    ckpt = tmp_path / "kimi-bf16"
    t0 = time.time()
    preset_checkpoint(ckpt, int4=False)
    res = {"model": "Kimi-K2.5 tiny (bf16)", "build_s": round(time.time() - t0, 1)}
    out = tmp_path / "ds"
    t0 = time.time()
    rc = run_extract(
        "model=kimi_k25",
        "engine=gpu",
        "model.tp_size=1",
        f"model.path={ckpt}",
        "dataset.max_samples=8",
        "capture.final=[post_norm]",
        "check.logprob_samples=4",
        out=out,
        log=tmp_path / "extract.log",
    )
    res.update(extract_rc=rc, extract_s=round(time.time() - t0, 1))
    save("final-check-kimi", res)
    assert rc == 0, (tmp_path / "extract.log").read_text()[-4000:]
    res["verify_rc"], res["verify"] = verify(out)
    checks = sorted((out / "final_check").glob("*.json"))
    assert checks, "no final_check/*.json: " + (tmp_path / "extract.log").read_text()[-3000:]
    fc = json.loads(checks[0].read_text())
    res["final_check"] = fc
    save("final-check-kimi", res)
    for s in fc["samples"]:
        print(
            f"kimi final check sample {s['id']}: {s.get('tokens')} tokens, loss "
            f"{s.get('loss')} vs SGLang {s.get('engine_loss')} (max token diff "
            f"{s.get('max_token_diff')}) {'ok' if s['ok'] else 'FAILED'}"
        )
    assert res["verify_rc"] == 0, res["verify"]
    assert fc["final"] == "post_norm" and len(fc["samples"]) == 4, fc
    assert all(math.isfinite(s["engine_loss"]) and s["engine_loss"] > 0 for s in fc["samples"])
    assert fc["ok"], json.dumps(fc, indent=1)
