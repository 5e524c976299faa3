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
    small = OutputConfig(dir="x", shard_bytes=1 << 20)
    n = rows_in_flight(small, 1 << 20, 32768, ROW)
    assert (small.writer_threads + 2 + 1) * 32768 * ROW + n * ROW <= small.max_host_bytes
    # Kimi-K2.5's width (3 x 7168 bf16) at 32K: 9 whole samples do not fit in 8 GiB
    with pytest.raises(ValueError, match="shards of 1409286144 bytes"):
        rows_in_flight(OutputConfig(dir="x"), 131072, 32768, 3 * 7168 * 2)


def test_a_budget_without_room_for_one_sample_is_refused_with_the_fix():
    out = OutputConfig(dir="x", max_host_bytes=3 << 30, shard_bytes=256 << 20, writer_threads=6)
    with pytest.raises(ValueError, match=r"max_seq_len=32768; raise output.max_host_bytes"):
        rows_in_flight(out, 131072, 32768, ROW)
    assert rows_in_flight(out, 131072, 8192, ROW) >= 8192
