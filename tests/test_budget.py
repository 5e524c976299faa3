"""pipeline.rows_in_flight: the host-memory budget for captured rows (no engine needed)."""

import pytest

from hsdump.config import OutputConfig
from hsdump.pipeline import rows_in_flight

ROW = 3 * 4096 * 2  # three bf16 layers of an 8B-shaped model: 24,576 bytes per token


def test_the_default_budget_holds_shards_rows_in_flight_and_one_stitched_sample():
    out = OutputConfig(dir="x")
    n = rows_in_flight(out, 1 << 20, 32768, ROW)
    # a 32K sample (805 MB) is larger than a 256 MiB shard: each shard held is one sample
    held = (out.writer_threads + 2) * 32768 * ROW
    assert 32768 <= n < 1 << 20  # the 8 GiB default lowers an engine limit of 1M tokens
    assert held + (n + 32768) * ROW <= out.max_host_bytes
    assert held + (n + 1 + 32768) * ROW > out.max_host_bytes  # and uses what is left


def test_an_engine_limit_below_the_budget_is_kept():
    assert rows_in_flight(OutputConfig(dir="x"), 131072, 8192, ROW) == 131072


def test_shards_count_as_whole_samples_when_a_sample_exceeds_the_shard_size():
    out = OutputConfig(dir="x")  # 8 GiB, 6 threads + 2 shards of 256 MiB
    # 32K: a sample (805 MB) is larger than a shard, so 8 held shards + 1 stitched = 9 samples
    assert rows_in_flight(out, 1 << 20, 32768, ROW) == ((8 << 30) - 9 * 32768 * ROW) // ROW
    # 8K: a sample (201 MB) is smaller than a shard: 8 shards of 256 MiB + 1 stitched sample
    assert (
        rows_in_flight(out, 1 << 20, 8192, ROW) == ((8 << 30) - 8 * (256 << 20) - 8192 * ROW) // ROW
    )
    # Kimi-K2.5's width (3 x 7168 bf16) at 32K: 9 whole samples do not fit in 8 GiB
    with pytest.raises(ValueError, match="shards of 1409286144 bytes"):
        rows_in_flight(OutputConfig(dir="x"), 131072, 32768, 3 * 7168 * 2)


def test_a_budget_without_room_for_one_sample_is_refused_with_the_fix():
    out = OutputConfig(dir="x", max_host_bytes=3 << 30, shard_bytes=256 << 20, writer_threads=6)
    with pytest.raises(ValueError, match=r"max_seq_len=32768: set output.max_host_bytes=") as e:
        rows_in_flight(out, 131072, 32768, ROW)
    assert rows_in_flight(out, 131072, 8192, ROW) >= 8192
    # the value it names is enough, and one byte less is not
    need = int(str(e.value).split("output.max_host_bytes=")[2].split(" ")[0])
    assert rows_in_flight(OutputConfig(dir="x", max_host_bytes=need), 131072, 32768, ROW) == 32768
    with pytest.raises(ValueError, match="max_host_bytes"):
        rows_in_flight(OutputConfig(dir="x", max_host_bytes=need - 1), 131072, 32768, ROW)


def test_an_inflight_limit_below_one_sample_is_not_a_memory_refusal():
    """engine=cpu and engine=dry keep engine.inflight_tokens=8192; a 32K-context model's
    samples are then admitted one at a time (the engine always admits one request), which the
    budget holds: accepted, at 32 GiB and at the default 8 GiB alike (issue 51: refused, naming
    output.max_host_bytes)."""
    for host in (8 << 30, 32 << 30):
        out = OutputConfig(dir="x", max_host_bytes=host)
        assert rows_in_flight(out, 8192, 32768, 5 * 896 * 2) == 8192


def test_a_dry_run_of_a_32k_context_model_is_accepted(tmp_path):
    """The issue's case end to end: a Qwen2-class checkpoint with a 32K context
    (max_position_embeddings 32768, as Qwen2.5-0.5B's) on engine=dry, dataset.max_seq_len the
    longest SGLang takes (the context less 7)."""
    import json

    from harness import DRY, extract

    from hsdump.testing import close_layers

    ckpt = close_layers.build(tmp_path / "qwen2-32k")
    assert json.loads((ckpt / "config.json").read_text())["max_position_embeddings"] == 32768
    rc, log = extract(
        DRY,
        f"model.path={ckpt}",
        "model.default_layers=[2,4,6]",
        "dataset.max_samples=3",
        "dataset.max_seq_len=32761",
        out=tmp_path / "ds",
        timeout=300,
    )
    assert rc == 0, log[-3000:]
    assert "max_host_bytes" not in log, log[-3000:]
    assert json.loads((tmp_path / "ds" / "manifest.json").read_text())["max_seq_len"] == 32761


def test_a_length_limit_the_kv_pool_sets_names_the_pool_that_holds_it():
    """engine=cpu's KV pool (max_total_tokens=8192) under a 32K context: the refusal of a
    longer dataset.max_seq_len names the engine.max_total_tokens that takes it (and that value
    works), beside the shorter max_seq_len; where the context is the limit, no pool is named."""
    from hsdump.capture.layers import ModelInfo, check_length_limit
    from hsdump.config import Config, DatasetConfig, EngineConfig

    info = ModelInfo("Qwen2ForCausalLM", 896, 24, 32768, vocab_size=151936, context_length=32768)

    def cfg(n, pool):
        return Config(
            model={"path": "/m"},
            dataset=DatasetConfig(path="/d.jsonl", max_seq_len=n),
            engine=EngineConfig(max_total_tokens=pool),
        )

    with pytest.raises(ValueError) as e:
        check_length_limit(cfg(32761, 8192), info)
    msg = str(e.value)
    assert "dataset.max_seq_len=8185 or less" in msg and "engine.max_total_tokens=32768" in msg
    check_length_limit(cfg(32761, 32768), info)
    with pytest.raises(ValueError) as e:
        check_length_limit(cfg(32762, 32768), info)
    assert "max_total_tokens" not in str(e.value).split("takes:", 1)[1].split("tokens.")[1]
