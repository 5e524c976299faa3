"""hsdump.capture.start, the engine API of the benchmarks and the GPU tests, on the dry engine:
conf/engine/'s presets as EngineConfig (what the YAML says, overrides, refusals), the engine of
a model folder, and the manifest its rows are written under (read back by the loader)."""

import pytest
import yaml
from factories import ROOT

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

    def sink(sid, ids, hs, bad):  # the rows: the layers, then the final states
        w.add(sid, ids, [1] * len(ids), hs[:2], final={"post_norm": hs[2]}, nonfinite=bad)

    with start(tiny_llama, layers, engine_preset("dry"), final=["post_norm"]) as eng:
        assert eng.final == ["post_norm"]
        eng.run(prompts, sink)
    w.close()
    ds = HsdumpDataset(str(tmp_path / "ds"), allow_dry=True)
    assert sorted(ds.ids) == [0, 1] and ds.layers == layers
    rec = ds.get(1)
    assert rec["input_ids"].tolist() == prompts[1][1]
    assert [tuple(h.shape) for h in rec["hidden_states"]] == [(30, manifest.model.hidden_size)] * 2
    assert tuple(rec["final"]["post_norm"].shape) == (30, manifest.model.hidden_size)
