"""Every family SGLang's CPU engine runs, through extract.py, against transformers float32.

Per family (tests/families.py: a tiny random checkpoint built with transformers' own classes
and the structural options and config.json fields of the real checkpoints), one extraction of
the layers [L - 2, 1, L // 2, 2, L - 1] (`capture_layers`: the first and the last capturable
index, unsorted so the user's order must be the stored order) with capture.final = [pre_norm,
post_norm]. Each stored layer k must match transformers' `hidden_states[k]` by the rule of
tests/test_engine.py (err <= 3 x transformers' own bf16 error + 0.002) and be far from its
neighbours k - 1 and k + 1 (an off-by-one fails loudly); pre_norm must match the final norm's
input and post_norm its output. The families the CPU engine cannot run get the same test on the
GPU (marked gpu; the MoE families by the MoE rule of tests/tolerance.py);
bench/families_probe.py --device gpu recorded their last results (bench/results/, README
"Model families").
"""

import sys
from pathlib import Path

import harness
import pytest
import torch
from factories import ROOT
from families import FAMILIES, build, hf_hidden_states, run_extract
from tolerance import final_state_ok, moe_layer_failures, neighbours, per_sample_ok, rel_err

pytestmark = pytest.mark.engine

# the families SGLang 0.5.23's CPU engine runs (bench/results/families-cpu.json); the others
# fail in SGLang's CPU kernels or attention backends, not in hsdump
# (Qwen2ForCausalLM's is tests/test_qwen_coder.py: the layers and final states captured here, of
# the real Qwen2.5-Coder-1.5B-Instruct, whose config has the structural options of the tiny
# Qwen2 checkpoint that ran here (untied head, rope_theta 1e6, no sliding window), on four real
# chats, by `hsdump check`; that run was one more engine start, 33-36 s of a CI worker)
CPU_FAMILIES = [
    "llama",
    "qwen3",
    "qwen3_moe",
    "glm4_moe",
    # phi3 and mistral: SGLang 0.5.23's classes are LlamaForCausalLM's code (llama's test runs
    # it); their last CPU runs are bench/results/families-cpu.json's (hsdump.capture.families)
    "gemma3",
    "gemma3_vl",
    # issue 33's targets (4 layers, hidden 128)
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen2_5_vl",
    "ministral3",
    "apertus",
    "mellum",
    "gemma4_vl",
]
# SGLang's Gemma-4 refuses the torch_native attention backend by name; intel_amx passes that
# check and then falls back to torch_native on a CPU without AMX (SGLang logs it)
CPU_OVERRIDES = {"gemma4_vl": ["engine.attention_backend=intel_amx"]}
MOE = {"qwen3_moe", "glm4_moe"}

# the families SGLang's CPU engine cannot run, on one GPU; their last results: SGLang 0.5.17 in
# bench/results/families-cpu.json (gpu_preview), SGLang 0.5.23 in families-gpu-0523.json
# (bench/families_probe.py --device gpu, the same checks); extra overrides per family
GPU_FAMILIES = {
    "qwen3_next": [],
    "qwen3_5": [],
    "qwen3_5_vl": [],
    "qwen3_5_moe": [],
    "qwen3_5_moe_vl": [],
    "gpt_oss": [],
    "minimax_m2": [],
    "deepseek_v3": [],
    "deepseek_v32": [],
    # without it SGLang sizes the chunked-attention pool from max_position_embeddings (10M)
    "llama4": ["+engine.extra.context_length=8192"],
    "gemma3": [],
    "gemma3_vl": [],
    # issue 33's targets SGLang 0.5.23's CPU engine cannot run (the reasons:
    # bench/results/families-cpu.json, `refused`); qwen2_moe, deepseek_v2 and glm4_moe_lite
    # passed the 0.5.23 GPU probe, the others failed there (reasons in `refused`)
    "qwen2_moe": [],
    "llama4_text": ["+engine.extra.context_length=8192"],
    "deepseek_v2": [],
    "glm4_moe_lite": [],
    "gemma4_vl": [],
    "exaone_moe": [],
    "glm5_next": [],
    "gemma4_unified": [],
}
# routed experts flip on near-ties in either bf16 run: tests/tolerance.py's MoE rule (mean and
# worst prompt against transformers' own bf16 error) instead of the per-sample rule
GPU_MOE = {
    "qwen3_next",
    "qwen3_5_moe",
    "qwen3_5_moe_vl",
    "gpt_oss",
    "minimax_m2",
    "deepseek_v3",
    "deepseek_v32",
    "llama4",
    "qwen2_moe",
    "llama4_text",
    "deepseek_v2",
    "glm4_moe_lite",
    "exaone_moe",
    "glm5_next",
}


def _stack(model):
    """transformers' decoder stack (the module with `layers` and `norm`), wrapper or not."""
    for m in model.modules():
        if isinstance(getattr(m, "layers", None), torch.nn.ModuleList) and hasattr(m, "norm"):
            return m
    raise AssertionError(f"no decoder stack in {type(model).__name__}")


@torch.no_grad()
def _final_states(ckpt: Path, cls: str, prompts):
    """(pre_norm, post_norm) per prompt: the final norm's input and output, float32."""
    import transformers

    model = getattr(transformers, cls).from_pretrained(str(ckpt), dtype=torch.float32).eval()
    seen = {}
    hook = _stack(model).norm.register_forward_hook(
        lambda m, a, out: seen.update(pre=a[0][0].clone(), post=out[0].clone())
    )
    try:
        out = []
        for ids in prompts:
            model(input_ids=torch.tensor([ids]), use_cache=False)
            out.append((seen["pre"], seen["post"]))
        return out
    finally:
        hook.remove()


FINAL = ["pre_norm", "post_norm"]


def capture_layers(n: int):
    """One capture list for a model of n decoder layers: the first (1) and the last (n - 1)
    capturable index, the middle, 2 and n - 2, each once, in an order that is not sorted."""
    layers = list(dict.fromkeys([n - 2, 1, n // 2, 2, n - 1]))
    assert layers != sorted(layers) and {1, 2, n // 2, n - 2, n - 1} <= set(layers), layers
    return layers


def _check(name, tmp_path, device="cpu", overrides=()):
    """One extraction of `capture_layers(L)` and both final kinds, checked against transformers;
    the worst layer error."""
    from hsdump.store.reader import HsdumpDataset

    fam_ckpt = build(name)
    layers = capture_layers(FAMILIES[name].num_layers)
    out = tmp_path / f"ds-{name}"
    run = run_extract(
        fam_ckpt,
        name,
        layers,
        out,
        "gpu" if device == "cuda" else "cpu",
        3,
        600,
        tmp_path / f"{name}.log",
        overrides=[f"capture.final=[{','.join(FINAL)}]", *overrides],
    )
    assert run["rc"] == 0, run["log"][-3000:]
    ds = HsdumpDataset(str(out))
    # the user's (unsorted) order is the stored order, in the manifest and in every record
    assert list(ds.layers) == layers and ds.manifest["layers"] == layers
    assert ds.manifest["final"] == FINAL
    recs = {sid: ds.get(sid) for sid in ds.ids}
    ds.close()
    assert len(recs) == 3
    cls = FAMILIES[name].cls
    prompts = [recs[s]["input_ids"].tolist() for s in sorted(recs)]
    ref32 = hf_hidden_states(fam_ckpt, cls, prompts, torch.float32, device)
    ref16 = hf_hidden_states(fam_ckpt, cls, prompts, torch.bfloat16, device)
    moe = device == "cuda" and name in GPU_MOE
    errs = {k: [] for k in layers}
    scales = {k: [] for k in layers}
    finals = _final_states(fam_ckpt, cls, prompts)
    last = max(layers)  # L - 1: the final states go through it and the norm
    worst = 0.0
    for p, sid in enumerate(sorted(recs)):
        hs = recs[sid]["hidden_states"]
        assert len(hs) == len(layers), (name, sid, len(hs))
        for j, k in enumerate(layers):
            err, scale = rel_err(hs[j], ref32[p][k]), rel_err(ref16[p][k], ref32[p][k])
            errs[k].append(err)
            scales[k].append(scale)
            assert moe or per_sample_ok(err, scale), (name, sid, k, err, scale)
            nb = neighbours(hs[j], ref32[p], k)  # an off-by-one fails loudly
            assert nb.ok, (name, sid, nb.failures(f"layer {k}"))
            worst = max(worst, err)
        got, (pre, post) = recs[sid]["final"], finals[p]
        # the final states through the last layer and the norm: the MoE families' routing
        # in bf16 flips experts on near-ties, so they get the layers' scale
        scale = rel_err(ref16[p][last], ref32[p][last])
        assert final_state_ok(rel_err(got["pre_norm"], pre), scale), (name, sid, "pre_norm")
        assert final_state_ok(rel_err(got["post_norm"], post), scale), (name, sid, "post_norm")
        assert rel_err(got["pre_norm"], post) > 0.1
    if moe:
        lens = [len(x) for x in prompts]
        bad = [b for k in layers for b in moe_layer_failures(k, errs[k], scales[k], lens)]
        assert not bad, (name, bad)
    return worst


@pytest.mark.parametrize("name", CPU_FAMILIES)
def test_family_matches_transformers(name, tmp_path):
    print(f"{name}: worst {_check(name, tmp_path, overrides=CPU_OVERRIDES.get(name, ())):.4f}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")
@pytest.mark.parametrize("name", sorted(GPU_FAMILIES))
def test_family_matches_transformers_on_the_gpu(name, tmp_path):
    worst = _check(name, tmp_path, "cuda", GPU_FAMILIES[name])
    print(f"{name}: worst {worst:.4f}")


def test_unverified_class_is_refused_before_the_engine(tmp_path):
    # Llama-4's text-only SGLang class has EAGLE-3 capture but no check against transformers
    # passed (only its multimodal wrapper did, on the GPU): extract.py refuses it by name
    # before anything starts, unless the user allows it
    ckpt = build("llama4_text")
    out = tmp_path / "ds"
    rc, text = harness.extract(
        f"model.path={ckpt}",
        "model.chat_template=deepseek_v3.jinja",
        "dataset.max_samples=2",
        out=out,
        timeout=300,
    )
    assert rc != 0 and "Llama4ForCausalLM" in text
    assert "capture.allow_unverified=true" in text and "Traceback" not in text
    assert not (out / "manifest.json").exists()


@pytest.mark.engine  # imports SGLang's model registry (no engine starts)
def test_readme_table_is_the_generated_one():
    import subprocess

    # bench/families_table.py prints the table (tests run it, import nothing of bench/)
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "families_table.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    from hsdump.testing.families import README_TABLE

    begin, end = README_TABLE
    readme = (ROOT / "README.md").read_text()
    i, j = readme.index(begin), readme.index(end)
    assert readme[i + len(begin) : j].strip() == p.stdout.strip(), (
        "README's family table is stale: .venv/bin/python bench/families_table.py --write"
    )
    # every verified class has a row that says so, and only those
    from hsdump.capture.families import FAMILIES as VERIFIED

    for fam in VERIFIED:
        for arch in fam.architectures:
            row = next(r for r in readme.splitlines() if r.startswith(f"| `{arch}` |"))
            assert "**verified**" in row, row
            # with the SGLang version of each check
            for v in fam.versions:
                assert f"SGLang {v} (" in row.split("**verified**", 1)[1], (row, v)
    # a target that stays refused says why, and for which SGLang version
    import json

    refused = json.loads((ROOT / "bench" / "results" / "families-cpu.json").read_text())
    for arch, r in refused.get("refused", {}).items():
        row = next(x for x in readme.splitlines() if x.startswith(f"| `{arch}` |"))
        assert "**verified**" not in row and r["reason"][:40] in row, row
        assert f"(SGLang {r['sglang']})" in row, row
