"""Kimi-K2.5 as its checkpoint is, through the preset and nothing else: a tiny
KimiK25ForConditionalGeneration in the real layout (tests/kimi_checkpoint.py: a 61-layer
DeepSeek-V3 text model, a MoonViT tower, Kimi's tiktoken tokenizer files and chat template), bf16
and with compressed-tensors INT4 routed experts, through

    extract.py model=kimi_k25 engine=gpu model.tp_size=1 model.path=<it> dataset.max_samples=50

then `hsdump verify` (clean), and every stored layer (the preset's [3, 31, 59]) against a
float32 transformers DeepseekV3ForCausalLM forward of the same text weights (for INT4 the
dequantized values) by hsdump.check's comparison: the MoE rule (rule 2), and every sample's
rows closest to their own index.

Run on a GPU machine: python3 -m pytest -q -s tests/test_gpu_kimi.py (HSDUMP_GPU_RESULTS writes
kimi-bf16.json / kimi-int4.json; HSDUMP_GPU_OVERRIDES adds extract.py overrides: tests/gpu.py).
"""

import time

import pytest
import torch
from gpu import failures, records, run_extract, save, verify
from kimi_checkpoint import preset_checkpoint, reference_dir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)"),
]

PRESET_LAYERS = [3, 31, 59]


# SGLang 0.5.23's first INT4 forward on a fresh host JIT-builds its Marlin MoE kernels: the
# extraction took 763 s there (docs/reports/2026-12-02-gpu-sglang-0523.md), past the suite's 600 s
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("int4", [False, True], ids=["bf16", "int4"])
def test_kimi_k25_checkpoint_through_the_preset(int4, tmp_path):
    from hsdump import check

    mode = "int4" if int4 else "bf16"
    t0 = time.time()
    ckpt = preset_checkpoint(tmp_path / f"kimi-{mode}", int4)
    res = {"int4": int4, "build_s": round(time.time() - t0, 1)}
    out = tmp_path / f"ds-{mode}"
    t0 = time.time()
    rc = run_extract(
        "model=kimi_k25",
        "engine=gpu",
        "model.tp_size=1",
        f"model.path={ckpt}",
        "dataset.max_samples=50",
        out=out,
        log=tmp_path / f"extract-{mode}.log",
    )
    res.update(extract_rc=rc, extract_s=round(time.time() - t0, 1))
    save(f"kimi-{mode}", res)
    assert rc == 0, (tmp_path / f"extract-{mode}.log").read_text()[-4000:]
    res["verify_rc"], res["verify"] = verify(out)
    recs = records(out)
    prompts = [r["input_ids"].tolist() for r in recs]
    ref = check.reference(reference_dir(ckpt), prompts, device="cuda")
    layers = check.compare_layers(PRESET_LAYERS, recs, ref, moe=True)
    res.update(
        samples=len(recs),
        tokens=sum(map(len, prompts)),
        layers=[r.to_dict() for r in layers],
    )
    save(f"kimi-{mode}", res)
    for r in layers:
        print(
            f"kimi {mode} layer {r.index}: worst {max(r.err):.4f} mean "
            f"{sum(r.err) / len(r.err):.4f} | hf bf16 worst {max(r.hf_bf16):.4f} | {r.neighbour}"
        )
    assert res["verify_rc"] == 0, res["verify"]
    assert [r.index for r in layers] == PRESET_LAYERS and len(recs) > 40
    bad = failures(layers, moe=True)
    assert not bad, "\n".join(bad[:10])
