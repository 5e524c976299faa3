import pytest
import torch

from hsdump.store import fp8


def heavy_tailed(n, h, seed=0):
    """Residual-stream-like activations: Student-t body plus a few massive channels."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, h, generator=g)
    chi = torch.randn(n, h, 3, generator=g).pow(2).sum(-1) / 3  # t with 3 dof
    x = z / chi.sqrt()
    x[:, :4] *= 200.0  # massive activations in a few channels
    return x


def test_round_trip_shapes_dtypes_and_error():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    q, s = fp8.quantize(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert s.dtype == torch.float32 and s.shape == (64,)
    # the largest |value| of every row lands on 448
    assert torch.allclose(q.float().abs().amax(1), torch.full((64,), 448.0))
    y = fp8.dequantize(q, s, torch.float32)
    assert y.dtype == torch.float32
    err = fp8.rel_error(y, x)
    assert 0.005 < err < 0.04  # e4m3: ~2-3% RMS
    assert fp8.rel_error(x.bfloat16(), x) < 0.005
    assert fp8.dequantize(q, s).dtype == torch.bfloat16


def test_heavy_tails_and_zero_rows():
    x = heavy_tailed(128, 512)
    x[5] = 0
    q, s = fp8.quantize(x)
    assert torch.isfinite(q.float()).all() and s[5] == 1.0
    y = fp8.dequantize(q, s, torch.float32)
    assert y[5].eq(0).all()
    assert fp8.rel_error(y, x) < 0.04
    # small values in a row with a 200x outlier are not flushed to zero
    nz = x[:, 4:].abs() > 1e-3
    assert (y[:, 4:][nz] != 0).float().mean() > 0.999


def test_encode_names_and_bf16_input():
    x = torch.randn(3, 8).bfloat16()
    t = fp8.encode("7/hidden_states/2", x)
    assert set(t) == {"7/hidden_states/2", "7/hidden_states/2/scale"}
    assert fp8.shard_metadata() == {
        "storage_dtype": "float8_e4m3fn",
        "fp8_scaling": "per_token_absmax",
    }
    assert fp8.is_fp8("fp8") and fp8.is_fp8("float8_e4m3fn") and not fp8.is_fp8("bfloat16")
    with pytest.raises(ValueError):
        fp8.quantize(torch.randn(2, 3, 4))
    with pytest.raises(ValueError):
        fp8.dequantize(t["7/hidden_states/2"], torch.ones(4))


def test_error_report_and_bench_script():
    x = fp8.heavy_tailed(64, 128, massive=(3, 77))
    r = fp8.error_report(x, massive=[3, 77])
    assert r["bf16_rel"] < 0.005 < r["fp8_rel"] < 0.04 and r["fp8_cos_min"] > 0.99
    assert r["fp8_rest_worst_token"] < 0.06
    import subprocess
    import sys

    from factories import ROOT

    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "fp8_error.py"),
            "--seq",
            "16",
            "--hidden",
            "64",
            "--layers",
            "2",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert '"fp8": 2432' in out and "heavy_tailed" in out  # 16*16 + 2*(16*64 + 16*4)
