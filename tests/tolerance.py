"""The tolerance rules of hsdump's fidelity checks against transformers float32: their one home.

Tests import them from here; the bench scripts (bench/gpu_check.py, bench/gpu_layouts.py,
bench/gpu_nodes.py, bench/families_probe.py, bench/kimi_check.py) put tests/ on sys.path and
import them from here too. Nothing here imports torch at module level or anything of bench/.

Relative error of a sample and a layer is ||a - b|| / ||b|| over the whole [seq, hidden]
tensor (`rel_err`). The engine runs in bf16, transformers in float32 on the same bf16
weights; the scale of what bf16 costs is transformers' own bf16 forward on the same inputs
(`scale` below: its relative error against float32).

1. Per-sample rule (dense models; tests/test_engine.py, test_pipeline.py, test_regenerate.py,
   test_families.py, bench/families_probe.py): every sample's error at layer k
   <= PER_SAMPLE_FACTOR * scale + PER_SAMPLE_EPS, while the neighbouring layers k - 1 and
   k + 1 stay far outside it (error > NEIGHBOUR_FACTOR * err + NEIGHBOUR_EPS: an off-by-one
   fails loudly). bf16 keeps 8 significant bits, so every matmul and norm rounds at
   ~2^-9 = 0.002 relative; through a few layers that accumulates to ~0.5%.

2. The MoE rule (the GPU rule; tests/test_gpu.py through bench/gpu_check.py,
   bench/gpu_layouts.py, bench/kimi_check.py, bench/families_probe.py's `moe_rule_ok`), judged
   per layer against transformers' own bf16-vs-float32 errors on the same prompts, TOL_EPS
   being absolute slack:
    a. mean over prompts of SGLang's error <= TOL_MEAN_FACTOR * mean of HF-bf16's error
       + TOL_EPS (catches systematic errors: adjacent layers of these models differ by
       0.54-4.1);
    b. every prompt's SGLang error <= TOL_FACTOR * the largest HF-bf16 error at that layer
       + TOL_EPS (catches one broken sample: lost or reordered chunks, rows of another
       request).
   Per-prompt ratios are not used: in an MoE a near-tied router flips experts for a few tokens
   in either bf16 run, so on the H200 one 33-token prompt had 0.040 (SGLang) against 0.0078
   (HF bf16) while the other prompts had HF bf16 at or above SGLang. See docs/performance.md, "Fidelity on the GPU".

3. Final states (capture.final; tests/test_families.py): pre_norm / post_norm through the last
   layer and the final norm <= PER_SAMPLE_FACTOR * the last layer's scale + FINAL_EPS (the MoE
   families' routing in bf16 flips experts on near-ties, so they get the layers' scale).
"""

from __future__ import annotations

from typing import Dict, List, Sequence

# 1. per sample (dense)
PER_SAMPLE_FACTOR = 3.0
PER_SAMPLE_EPS = 0.002
NEIGHBOUR_FACTOR = 5.0
NEIGHBOUR_EPS = 0.01
# bench/families_probe.py: a failing layer "matches" index j when err_j <= 5 * bf16_err + 0.01
MATCH_FACTOR = 5.0
MATCH_EPS = 0.01

# 2. the MoE (GPU) rule
TOL_MEAN_FACTOR = 2.0
TOL_FACTOR = 3.0
TOL_EPS = 0.005

# 3. final states
FINAL_EPS = 0.02

# bench/gpu_nodes.py: the two-node dataset against the one-process TP 1 dataset, worst
# relative error per tensor (MoE in bf16; TP 2 against TP 1 measured within 0.08)
NODES_VS_TP1_MAX = 0.1


def rel_err(a, ref) -> float:
    """||a - ref|| / ||ref|| over the whole tensor, in float32."""
    a, ref = a.float(), ref.float()
    return float((a - ref).norm() / ref.norm())


def per_sample_ok(err: float, scale: float) -> bool:
    """Rule 1: one sample's error at one layer against transformers' bf16 error there."""
    return err <= PER_SAMPLE_FACTOR * scale + PER_SAMPLE_EPS


def neighbour_far(neighbour_err: float, err: float) -> bool:
    """Rule 1's other half: the rows are far from the neighbouring layer's states."""
    return neighbour_err > NEIGHBOUR_FACTOR * err + NEIGHBOUR_EPS


def final_state_ok(err: float, last_layer_scale: float) -> bool:
    """Rule 3: a final state against transformers' float32 one."""
    return err <= PER_SAMPLE_FACTOR * last_layer_scale + FINAL_EPS


def moe_layer_failures(
    k,
    errs: Sequence[float],
    ref: Sequence[float],
    prompt_lens: Sequence[int],
    factor: float = TOL_FACTOR,
    mean_factor: float = TOL_MEAN_FACTOR,
    eps: float = TOL_EPS,
) -> List[str]:
    """Rule 2 at one layer: `errs` SGLang's errors per prompt, `ref` HF-bf16's; [] passes."""
    bad = []
    m_sgl, m_ref = sum(errs) / len(errs), sum(ref) / len(ref)
    if not m_sgl <= mean_factor * m_ref + eps:
        bad.append(
            f"layer {k}: mean sglang err {m_sgl:.4f} > {mean_factor} * mean "
            f"hf-bf16 err {m_ref:.4f} + {eps}"
        )
    for p, e in enumerate(errs):
        if not e <= factor * max(ref) + eps:
            bad.append(
                f"layer {k}, prompt {p} (len {prompt_lens[p]}): sglang err "
                f"{e:.4f} > {factor} * max hf-bf16 err {max(ref):.4f} + {eps}"
            )
    return bad


def tolerance_failures(
    res: Dict,
    factor: float = TOL_FACTOR,
    mean_factor: float = TOL_MEAN_FACTOR,
    eps: float = TOL_EPS,
) -> List[str]:
    """Rule 2 over a result {"sglang_vs_hf_fp32": {layer: [err per prompt]},
    "hf_bf16_vs_hf_fp32": {layer: [...]}, "prompt_lens": [...], "problems": [...]}; an empty
    list means the case passes."""
    bad = list(res.get("problems", []))
    for k, errs in res.get("sglang_vs_hf_fp32", {}).items():
        bad += moe_layer_failures(
            k,
            errs,
            res["hf_bf16_vs_hf_fp32"][k],
            res.get("prompt_lens", []),
            factor,
            mean_factor,
            eps,
        )
    if not res.get("sglang_vs_hf_fp32"):
        bad.append("nothing was compared")
    return bad
