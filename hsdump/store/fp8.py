"""fp8 storage of hidden states: float8 e4m3 with one float32 scale per token.

A hidden-state tensor `x` of shape `[seq, H]` is stored as two tensors:

    {i}/hidden_states/{j}         float8_e4m3fn [seq, H]   q = round(x / scale[:, None])
    {i}/hidden_states/{j}/scale   float32       [seq]      scale = absmax(x[t, :]) / 448

so `x ~= q.float() * scale[:, None]`. Per-token absmax scaling keeps every token's largest
value at e4m3's largest finite number (448). e4m3 has 3 mantissa bits and its own exponent, so
every value keeps a relative rounding error of at most 2^-4 (6.25%; ~2-3% RMS) down to
2^-6 / 448 ~ 3.5e-5 of the row's absmax, and smaller ones are kept as subnormals instead of being rounded to
zero as int8 would. An all-zero row gets scale 1.

The reader (`hsdump.store.reader`) dequantizes transparently: a tensor whose stored dtype is
float8_e4m3fn is multiplied by its `/scale` companion and returned in the requested dtype
(bf16 by default). The writer calls `encode(name, x)` per hidden-state tensor.

No sglang, no Hydra: importable by trainers alone.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch

from hsdump.store.layout import FP8_SCALING as SCALING
from hsdump.store.layout import SCALE_SUFFIX, STORAGE, torch_dtype

STORAGE_NAME = STORAGE["fp8"]  # shard __metadata__["storage_dtype"]
FP8_DTYPE = torch_dtype(STORAGE_NAME)
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
STORAGE_ALIASES = ("fp8", "float8_e4m3fn", "fp8_e4m3")


def is_fp8(storage_dtype) -> bool:
    return str(storage_dtype) in STORAGE_ALIASES


def quantize(x: torch.Tensor):
    """`x` float [seq, H] -> (q float8_e4m3fn [seq, H], scale float32 [seq]).

    Computed in float32; values are clamped to +-448 so rounding never overflows to NaN.
    """
    if x.dim() != 2:
        raise ValueError(f"fp8.quantize expects [seq, hidden], got shape {tuple(x.shape)}")
    xf = x.float()
    amax = xf.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (xf / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16):
    """Inverse of `quantize`: `q.float() * scale[:, None]`, returned in `dtype`."""
    if q.dtype != FP8_DTYPE:
        raise ValueError(f"fp8.dequantize expects {FP8_DTYPE}, got {q.dtype}")
    if scale.shape != (q.shape[0],):
        raise ValueError(f"scale has shape {tuple(scale.shape)}, expected ({q.shape[0]},)")
    return (q.float() * scale.float()[:, None]).to(dtype)


def encode(name: str, x: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The writer hook: the tensors to store for hidden-state tensor `name` in fp8.

    `encode("7/hidden_states/0", h)` -> {"7/hidden_states/0": q, "7/hidden_states/0/scale": s}
    """
    q, s = quantize(x)
    return {name: q, name + SCALE_SUFFIX: s}


def shard_metadata() -> Dict[str, str]:
    """Extra `__metadata__` entries for a shard whose hidden states are stored in fp8."""
    return {"storage_dtype": STORAGE_NAME, "fp8_scaling": SCALING}


def rel_error(approx: torch.Tensor, ref: torch.Tensor) -> float:
    """||approx - ref|| / ||ref|| in float64 (Frobenius)."""
    ref = ref.double()
    return float((approx.double() - ref).norm() / ref.norm().clamp_min(1e-300))


# ---------------------------------------------------------------------- measurement
def error_report(x: torch.Tensor, massive: Optional[Sequence[int]] = None) -> Dict[str, float]:
    """Errors of bf16 and of fp8 (quantized from the bf16 values, as the writer does) against
    float32 `x` [seq, H], plus fp8 against the bf16 values. `massive`: channel indices whose
    error is left out of the `*_rest_worst_token` figures (how much a token's outliers cost
    its other channels under per-token scaling)."""
    xf = x.float()
    b = xf.bfloat16()
    q, s = quantize(b)
    d = dequantize(q, s, torch.float32)

    def per_token(a, ref):
        return (a - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)

    out = {
        "bf16_rel": rel_error(b, xf),
        "fp8_rel": rel_error(d, xf),
        "fp8_vs_bf16_rel": rel_error(d, b.float()),
        "fp8_token_rel_mean": float(per_token(d, xf).mean()),
        "fp8_token_rel_max": float(per_token(d, xf).max()),
        "bf16_token_rel_mean": float(per_token(b.float(), xf).mean()),
        "fp8_cos_min": float(torch.nn.functional.cosine_similarity(d, xf, dim=1).min()),
    }
    if massive:
        keep = torch.ones(x.shape[1], dtype=torch.bool)
        keep[list(massive)] = False
        out["fp8_rest_worst_token"] = float(per_token(d[:, keep], xf[:, keep]).max())
        out["bf16_rest_worst_token"] = float(per_token(b.float()[:, keep], xf[:, keep]).max())
    return out


def heavy_tailed(seq: int, hidden: int, seed: int = 0, massive=(1512, 2401)) -> torch.Tensor:
    """Residual-stream-like activations: Student-t (3 dof) values times log-normal channel
    scales, and "massive activations" (as in Llama/Qwen residual streams): a few fixed
    channels at ~10x on most tokens and 300-2000x on the first token and ~3% of others."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(seq, hidden, generator=g)
    chi = torch.randn(seq, hidden, 3, generator=g).pow(2).sum(-1) / 3
    x = z / chi.sqrt() * torch.empty(hidden).log_normal_(0.0, 0.7, generator=g)
    m = [c % hidden for c in massive]
    x[:, m] *= 10.0
    hot = torch.rand(seq, generator=g) < 0.03
    hot[0] = True
    mag = 300.0 + 1700.0 * torch.rand(int(hot.sum()), len(m), generator=g)
    x[hot.nonzero()[:, 0][:, None], torch.tensor(m)[None, :]] = mag
    return x
