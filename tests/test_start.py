"""hsdump.capture.start, the engine API of the benchmarks and the GPU tests, on the dry engine:
conf/engine/'s presets as EngineConfig (what the YAML says, overrides, refusals), the engine of
a model folder, and the manifest its rows are written under (read back by the loader)."""

import pytest
import torch
import yaml
from factories import ROOT

from hsdump.capture.base import CaptureSpec, Request
from hsdump.capture.start import engine_preset, rows_manifest, start
from hsdump.store.reader import HsdumpDataset
from hsdump.store.writer import DatasetWriter


@pytest.mark.parametrize("name", ["cpu", "gpu", "dry"])
def test_a_preset_is_its_yaml(name):
    raw = yaml.safe_load((ROOT / "conf" / "engine" / f"{name}.yaml").read_text())
    ec = engine_preset(name)
    for k, v in raw.items():
        if k != "defaults":
            assert getattr(ec, k) == v, k


def test_overrides_replace_and_extra_merges():
    ec = engine_preset("gpu", chunked_prefill_size=256, extra={"port": 31000})
    assert ec.chunked_prefill_size == 256 and ec.extra == {"port": 31000}
    assert ec.mem_fraction_static == engine_preset("gpu").mem_fraction_static


def test_an_unknown_preset_or_field_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="use one of cpu, gpu, dry"):
        engine_preset("tpu")
    with pytest.raises(ValueError, match=r"no field \['chunk'\]"):
        engine_preset("cpu", chunk=16)


def test_the_dry_engine_rows_go_through_the_writer_and_back(tiny_llama, tmp_path):
    layers, prompts = [5, 1], [(0, [5, 6, 7, 8]), (1, list(range(10, 40)))]
    manifest = rows_manifest(tiny_llama, layers, final=["post_norm"])
    assert manifest.layers == layers and manifest.final == ["post_norm"]
    assert manifest.model.architecture == "LlamaForCausalLM"
    w = DatasetWriter(str(tmp_path / "ds"), rows_manifest(tiny_llama, layers, final=["post_norm"]))

    def sink(s):  # the sample, with its mask, layer rows and final states
        assert len(s.layers) == 2 and list(s.final) == ["post_norm"] and s.nonfinite == []
        assert s.loss_mask == [1] * len(s.input_ids)
        w.add_sample(s)

    with start(tiny_llama, layers, engine_preset("dry"), final=["post_norm"]) as eng:
        assert eng.spec.final == ("post_norm",) and eng.spec.layers == (5, 1)
        eng.run([Request(sid, ids, [1] * len(ids)) for sid, ids in prompts], sink)
    w.close()
    ds = HsdumpDataset(str(tmp_path / "ds"), allow_dry=True)
    assert sorted(ds.ids) == [0, 1] and ds.layers == layers
    rec = ds.get(1)
    assert rec["input_ids"].tolist() == prompts[1][1]
    assert [tuple(h.shape) for h in rec["hidden_states"]] == [(30, manifest.model.hidden_size)] * 2
    assert tuple(rec["final"]["post_norm"].shape) == (30, manifest.model.hidden_size)


def test_a_captured_sample_keeps_the_specs_orders(tiny_llama):
    """An engine captures the final states in FINAL_KINDS order (pre_norm, post_norm) and says
    which rows hold NaN/Inf in that order; the CapturedSample has them in the spec's (the
    writer's) order, so the sink rejoins nothing."""
    from hsdump.capture.layers import read_model_info
    from hsdump.config import ModelConfig

    spec = CaptureSpec(
        model_path=tiny_llama,
        model=ModelConfig(path=tiny_llama),
        engine=engine_preset("dry"),
        layers=[5, 1],
        info=read_model_info(tiny_llama),
        final=["post_norm", "pre_norm"],
    )
    assert spec.engine_final == ["pre_norm", "post_norm"]
    rows = [torch.full((3, 2), float(v)) for v in range(4)]  # layer 5, layer 1, pre, post
    req = Request(7, [1, 2, 3], [0, 1, 1], conversation=[{"role": "user", "content": "x"}])
    s = spec.sample(req, rows, [2, 1])  # pre_norm and layer 1 hold NaN/Inf
    assert (s.sid, s.input_ids, s.loss_mask, s.conversation) == (
        7,
        [1, 2, 3],
        [0, 1, 1],
        req.conversation,
    )
    assert [float(t[0, 0]) for t in s.layers] == [0.0, 1.0]
    assert list(s.final) == ["post_norm", "pre_norm"]
    assert float(s.final["post_norm"][0, 0]) == 3.0 and float(s.final["pre_norm"][0, 0]) == 2.0
    assert s.nonfinite == [1, 3]  # layer 1; pre_norm, the spec's second final kind
    with pytest.raises(ValueError, match="3 rows, not 2 layers"):
        spec.sample(req, rows[:3], [])
    with pytest.raises(ValueError, match="final kinds"):
        CaptureSpec(tiny_llama, spec.model, spec.engine, (1,), spec.info, final=("mid",))
