"""hsdump.capture.rows.pack_rows: the device-side layout and NaN/Inf flags, on plain tensors.

The real-engine tests (test_engine.py) check the same path end to end against transformers;
this pins the buffer layout and every kind of non-finite value at exact rows and slots."""

import torch

from hsdump.capture.rows import bad_slots, flags_valid, unpack_rows
from hsdump.capture.rows import pack_rows as _pack_rows


def unpack(buf, s, t, h):
    flat = buf.view(-1)
    return flat[: s * t * h].view(s, t, h), flat[s * t * h :].view(s, t) != 0


def test_layout_is_slot_major_with_flags_after_the_rows():
    t, h = 5, 4
    aux = torch.randn(t, 3 * h, dtype=torch.bfloat16)  # 3 aux layers side by side, as SGLang
    final = torch.randn(t, h, dtype=torch.float32)  # a final state in another dtype
    buf = _pack_rows([aux, final], t, h)
    assert buf.shape == (t, 4 * h + 4) and buf.dtype == torch.bfloat16
    rows, finite = unpack(buf, 4, t, h)
    for k in range(3):
        assert torch.equal(rows[k], aux[:, k * h : (k + 1) * h])
        assert rows[k].is_contiguous()
    assert torch.equal(rows[3], final.to(torch.bfloat16))
    assert finite.all()


def test_each_kind_of_nonfinite_value_flags_its_row_and_slot():
    t, h = 6, 8
    parts = [torch.randn(t, h) for _ in range(3)]  # aux given as a list of [T, H], as in 0.5.17
    parts[0][2, 5] = float("nan")
    parts[1][4, 0] = float("inf")
    parts[2][0, 7] = float("-inf")  # only amin sees this one
    _, finite = unpack(_pack_rows(parts, t, h), 3, t, h)
    bad = {(int(s), int(r)) for s, r in (~finite).nonzero()}
    assert bad == {(0, 2), (1, 4), (2, 0)}


def test_a_padded_forward_is_packed_for_its_real_rows():
    # a prefill CUDA graph runs the logits tail on a batch padded to a bucket (8 rows here,
    # 5 real) and SGLang keeps out.hidden_states[:5] (PrefillCudaGraphRunner._trim_logits_output)
    t_pad, n, h = 8, 5, 4
    parts = [torch.randn(t_pad, 2 * h), torch.randn(t_pad, h)]
    parts[0][6:] = float("nan")  # padding rows hold anything
    buf = _pack_rows(parts, n, h)[:n]
    rows, flags = unpack_rows(buf, 3, h)
    assert flags_valid(flags) and bad_slots(flags) == []
    assert torch.equal(rows[1], parts[0][:n, h:]) and torch.equal(rows[2], parts[1][:n])


def test_rows_cut_after_the_pack_are_detected():
    # the same cut applied to a buffer packed for all 8 rows misaligns every slot after the
    # first; the flag region then holds row values, which flags_valid rejects
    t_pad, n, h = 8, 5, 16
    parts = [torch.randn(t_pad, 3 * h)]
    rows, flags = unpack_rows(_pack_rows(parts, t_pad, h)[:n], 3, h)
    assert torch.equal(rows[0], parts[0][:n, :h])  # slot 0 still looks right...
    assert not torch.equal(rows[1], parts[0][:n, h : 2 * h])  # ...the others do not
    assert not flags_valid(flags)
    assert flags_valid(unpack_rows(_pack_rows(parts, t_pad, h), 3, h)[1])
