"""The family probe's verdict (hsdump.testing.probe, bench/families_probe.py's) from captured rows and transformers' (no engine): the right
layer passes, a shifted layer is named, and rows transformers shapes otherwise (GLM-5-next keeps
4 hyper-connection streams per layer) give "wrong" with the problem, not a crash."""

import torch

from hsdump.testing import probe as fp

T, H, L = 12, 16, 4
LAYERS = [1, 2, 3]


def reference(seed, streams=None):
    g = torch.Generator().manual_seed(seed)
    shape = (T, H) if streams is None else (T, streams, H)
    return [torch.randn(*shape, generator=g) for _ in range(L + 1)]


def records(ref, shift=0):
    rows = [ref[k + shift] if ref[k + shift].dim() == 2 else ref[k].mean(1) for k in LAYERS]
    return {0: {"input_ids": torch.arange(T), "hidden_states": [r.clone() for r in rows]}}


def noisy(ref, eps):
    g = torch.Generator().manual_seed(7)
    return [r + eps * r.norm() / r.numel() ** 0.5 * torch.randn(*r.shape, generator=g) for r in ref]


def test_the_right_layers_pass():
    ref = reference(0)
    rec = records(ref)
    cmp = fp.compare(rec, LAYERS, {0: ref}, {0: noisy(ref, 0.01)})
    out = fp.outcome(cmp, [rec[0]["input_ids"].tolist()])
    assert out["status"] == "ok" and out["worst"] == 0 and out["samples"] == 1
    assert out["bf16_worst"] > 0.005 and out["neighbour_min"] > 0.5


def test_a_shifted_layer_is_named():
    ref = reference(1)
    rec = records(ref, shift=-1)  # layer k holds hf[k - 1]
    cmp = fp.compare(rec, LAYERS, {0: ref}, {0: noisy(ref, 0.01)})
    out = fp.outcome(cmp, [rec[0]["input_ids"].tolist()])
    assert out["status"] == "wrong-layer", out
    assert any("rows match hf[0]" in d for d in out["detail"]), out["detail"]


def test_rows_whose_index_is_too_close_to_its_neighbour_are_named():
    """hsdump check's neighbour verdict (hsdump.check.neighbours): index 2 of this model is 0.01
    from index 1, the rows 0.008 from index 2 (within rule 1 against bf16's 0.005): too close
    to tell an off-by-one; 0.003 from it passes."""
    ref = reference(3)
    g = torch.Generator().manual_seed(5)
    ref[2] = ref[1] + 0.01 * ref[1].norm() / T**0.5 / H**0.5 * torch.randn(T, H, generator=g)
    for eps, status in ((0.008, "too-close"), (0.003, "ok")):
        rows = noisy(ref, eps)[2]
        rec = {0: {"input_ids": torch.arange(T), "hidden_states": [rows]}}
        cmp = fp.compare(rec, [2], {0: ref}, {0: noisy(ref, 0.005)})
        assert cmp["status"] == status, (eps, cmp["detail"])
        if status != "ok":
            assert "not more than 2.0 x the rows' error" in cmp["detail"][0], cmp["detail"]


def test_stream_rows_are_wrong_with_the_shape_problem_not_a_crash():
    ref = reference(2, streams=4)  # [T, 4, H] per layer, as transformers' GLM-5-next
    rec = records(ref)  # one row of H per token, as SGLang captures
    cmp = fp.compare(rec, LAYERS, {0: ref}, {0: ref})
    assert cmp["per_layer"] == {}
    out = fp.outcome(cmp, [rec[0]["input_ids"].tolist()])
    assert out["status"] == "wrong" and "worst" not in out
    assert f"sample 0 layer 1: shape ({T}, {H}) != ({T}, 4, {H})" in out["problems"]


def test_a_cached_checkpoint_lacking_a_new_config_field_is_rebuilt(tmp_path, monkeypatch):
    # hsdump.testing.families caches each family's checkpoint by name; a field added to the family
    # later (GLM-5-next's `mhc: true`, which SGLang reads and transformers does not write) must
    # reach the cached checkpoint, or the probe tests the old one
    import dataclasses
    import json

    from hsdump.testing import families

    fam = dataclasses.replace(families.FAMILIES["qwen2"], text_extras={"mhc": True})
    monkeypatch.setitem(families.FAMILIES, "qwen2", fam)
    dest = tmp_path / "qwen2"
    dest.mkdir()
    old = {"architectures": [fam.cls], **fam.extras, "text_config": {"mhc": True}, "marker": 1}
    (dest / "config.json").write_text(json.dumps(old))
    assert families.build("qwen2", dest=dest) == dest  # carries every field: reused as it is
    assert json.loads((dest / "config.json").read_text()) == old
    old["text_config"] = {}  # built before the family added the field
    (dest / "config.json").write_text(json.dumps(old))
    assert families._stale(dest / "config.json", fam)
    families.build("qwen2", dest=dest)
    raw = json.loads((dest / "config.json").read_text())
    assert raw["text_config"]["mhc"] is True and "marker" not in raw
    assert (dest / "model.safetensors").exists() and not families._stale(dest / "config.json", fam)
