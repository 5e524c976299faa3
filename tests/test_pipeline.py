"""`make extract`'s path end to end: Hydra config -> dataset -> real CPU engine -> shards, once;
resume and the multirun sweep (hsdump's bookkeeping) on engine=dry."""

import json

import harness
import pytest
import torch
from factories import compose_config, hf_hidden_states, shards
from harness import DRY
from tolerance import per_sample_ok, rel_err

from hsdump.config import register_configs, to_config
from hsdump.pipeline import run
from hsdump.store.reader import HsdumpDataset

register_configs()

EXTRACT = ["dataset.max_samples=12", "progress=false", "dataset.on_bad_row=skip"]


def config(*overrides):
    return compose_config(*overrides)


def test_composition_and_presets():
    c = to_config(config("model=kimi_k25", "engine=gpu"))
    assert c.model.tp_size == 8 and c.model.default_layers == [3, 31, 59]
    assert c.output.dir == "outputs/kimi-k2.5/layers-3-31-59"
    assert c.engine.device == "cuda" and c.engine.chunked_prefill_size == 16384
    c = to_config(
        config(
            "capture.layers=[1,2,3]",
            "dataset.max_samples=7",
            "output.root=/x",
            "+engine.extra.context_length=512",
        )
    )
    assert c.capture.layers == [1, 2, 3] and c.dataset.max_samples == 7
    assert c.output.dir == "/x/tiny-llama/layers-1-2-3" and c.engine.extra == {
        "context_length": 512
    }
    assert to_config(config()).output.dir == "outputs/tiny-llama/layers-eagle3"
    with pytest.raises(Exception, match="output.dtype='int3'"):
        to_config(config("output.dtype=int3"))
    with pytest.raises(Exception, match="no_such_key"):
        config("engine.no_such_key=1")


# The one real extraction of the embedded default (SGLang's CPU engine): what SGLang captures
# decides the rows, checked against transformers; the manifest names SGLang's version.
@pytest.mark.engine
def test_extract_writes_a_valid_dataset(tmp_path, tiny_llama):
    out = tmp_path / "ds"
    # with both final states, and the in-run final-state check of the first two samples
    check = ["capture.final=[pre_norm,post_norm]", "check.logprob_samples=2"]
    s = run(to_config(config(*EXTRACT, *check, f"output.dir={out}", "output.shard_bytes=200000")))
    assert s.written + sum(s.skipped.values()) == 12 and s.written >= 10

    manifest = json.loads((out / "manifest.json").read_text())
    for key in (
        "format",
        "format_version",
        "hsdump_version",
        "sglang_version",
        "model",
        "layers",
        "convention",
        "storage_dtype",
        "tokenizer",
        "dataset",
        "max_seq_len",
        "truncation",
        "config",
    ):
        assert key in manifest, key
    assert manifest["convention"] == "hf_hidden_states_index"
    assert manifest["layers"] == [2, 4, 5]  # EAGLE-3 default for the 8-layer tiny model
    assert manifest["model"]["hidden_size"] == 64 and manifest["sglang_version"] == "0.5.23"
    assert len(manifest["tokenizer"]["chat_template_sha256"]) == 64
    assert manifest["engine"] == "sglang"

    ds = HsdumpDataset(str(out))
    assert len(ds) == s.written and all(0 <= i < 12 for i in ds.ids)
    assert len(shards(out)) > 1
    r = ds[len(ds) - 1]
    ref = hf_hidden_states(tiny_llama, r["input_ids"].tolist())
    ref16 = hf_hidden_states(tiny_llama, r["input_ids"].tolist(), torch.bfloat16)
    for h, k in zip(r["hidden_states"], ds.layers):
        assert per_sample_ok(rel_err(h, ref[k]), rel_err(ref16[k], ref[k]))

    # `hsdump check` passes on it; the in-run check found the captured pre_norm state's loss
    # through the checkpoint's head equal to SGLang's own (docs/format.md, "Side files")
    from hsdump.tools import check

    rep = check.check(str(out), samples=3)
    print(check.table(rep))
    assert rep["ok"] and all(r["neighbour"] == "right" for r in rep["layers"]), rep
    fc = json.loads((out / "final_check" / "main.json").read_text())
    assert fc["ok"] and fc["final"] == "pre_norm" and len(fc["samples"]) == 2, fc
    print("in-run final-state check:", fc["samples"])


def test_extract_resumes_and_refuses_another_layer_set(tmp_path):
    """The same command again resumes (hsdump's commit records; engine=dry): nothing is
    recomputed, nothing changes; another layer set into the same folder is refused."""
    out = tmp_path / "ds"
    cfg = config(*EXTRACT, f"output.dir={out}", "output.shard_bytes=200000", DRY)
    s = run(to_config(cfg))
    assert s.written + sum(s.skipped.values()) == 12 and s.written >= 10
    assert len(HsdumpDataset(str(out), allow_dry=True)) == s.written and len(shards(out)) > 1

    stamps = {p: p.stat().st_mtime_ns for p in out.glob("shards/**/*.safetensors")}
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    s2 = run(to_config(cfg))
    assert s2.written == 0 and s2.already_done == s.written + s.skipped.get("nonfinite", 0)
    assert stamps == {p: p.stat().st_mtime_ns for p in out.glob("shards/**/*.safetensors")}
    assert before == {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert json.loads((out / "token_freq.json").read_text())  # loss-masked token counts

    # another layer set into the same folder is refused before any work, naming the field
    with pytest.raises(ValueError, match=r"layers: \[2, 4, 5\] -> \[1, 2, 3\]"):
        run(to_config(config(*EXTRACT, f"output.dir={out}", "capture.layers=[1,2,3]", DRY)))


def test_multirun_sweeps_layer_sets_into_separate_datasets(tmp_path):
    rc, log = harness.extract(
        "hydra.mode=MULTIRUN",  # `extract.py -m` (harness.extract puts its overrides first)
        "capture.layers=[1,2,3],[3,5,7]",
        "dataset.max_samples=3",
        f"output.root={tmp_path}",
        f"hydra.sweep.dir={tmp_path}/hydra",
        DRY,
    )
    assert rc == 0, log[-3000:]
    for layers in ([1, 2, 3], [3, 5, 7]):
        d = tmp_path / "tiny-llama" / ("layers-" + "-".join(map(str, layers)))
        ds = HsdumpDataset(str(d), allow_dry=True)
        assert ds.layers == layers and len(ds) == 3


def test_refusals_before_the_engine_starts(tmp_path, tiny_llama, monkeypatch):
    from hsdump.capture import serving
    from hsdump.capture.layers import ModelInfo, read_model_info
    from hsdump.config import EngineConfig, ModelConfig

    info = read_model_info(tiny_llama)
    ok = EngineConfig(device="cpu")
    m = ModelConfig(path=tiny_llama)
    with pytest.raises(ValueError, match="prefix-cache hit"):
        serving.check_supported(
            info, EngineConfig(device="cpu", extra={"disable_radix_cache": False}), m
        )
    with pytest.raises(ValueError, match="pp_size must be 1"):
        serving.check_supported(info, EngineConfig(device="cpu", extra={"pp_size": 2}), m)
    with pytest.raises(ValueError, match="enable_mixed_chunk is not supported"):
        serving.check_supported(
            info, EngineConfig(device="cpu", extra={"enable_mixed_chunk": True}), m
        )
    cohere = ModelInfo("CohereForCausalLM", 64, 8, 2048)
    with pytest.raises(ValueError, match="CohereForCausalLM .* has no EAGLE-3 aux capture"):
        serving.check_supported(cohere, ok, m)
    # a class captured through per-layer flags is judged by the class SGLang resolves: SGLang
    # 0.5.23's CPU build resolves Qwen3.5 to its own class or, when that module failed to
    # import in this process (seen in `make test`, not in `make test-fast`), to the
    # transformers fallback, which is refused
    from sglang.srt.models.registry import ModelRegistry

    from hsdump.capture.families import LAYER_FLAG_CAPTURE

    qwen35 = ModelInfo("Qwen3_5ForCausalLM", 64, 8, 2048)
    cls, _ = ModelRegistry.resolve_model_cls(["Qwen3_5ForCausalLM"])
    if cls.__name__ in LAYER_FLAG_CAPTURE:
        assert serving.check_supported(qwen35, ok, m) == "0.5.23"
    else:
        with pytest.raises(ValueError, match=rf"Qwen3_5ForCausalLM \({cls.__name__}\) has no"):
            serving.check_supported(qwen35, ok, m)
    assert serving.check_supported(info, ok, m) == "0.5.23"
    monkeypatch.setattr(serving, "sglang_version", lambda: "0.5.20")
    with pytest.raises(RuntimeError, match="sglang 0.5.20 is not supported.*0.5.17, 0.5.23"):
        serving.check_supported(info, ok, m)
    # out-of-range layers stop the run before tokenization or the engine
    with pytest.raises(ValueError, match=r"\[9\] out of range"):
        run(to_config(config("capture.layers=[1,9]", f"output.dir={tmp_path}/x")))
    assert not (tmp_path / "x").exists()
