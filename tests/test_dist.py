"""The split of one dataset across jobs (hsdump.dist): pure functions, no engine."""

import random
import re
from pathlib import Path

import pytest

from hsdump.dist import check, job_ids, owner, owns, split, writer_tag

SIZES = [0, 1, 2, 3, 7, 8, 9, 16, 100, 101, 1000]
JOBS = [1, 2, 3, 4, 7, 8, 16, 64, 1000]


@pytest.mark.parametrize("num_jobs", JOBS)
@pytest.mark.parametrize("n", SIZES)
def test_parts_are_disjoint_and_cover_every_id(n, num_jobs):
    ids = list(range(n))
    parts = [job_ids(ids, num_jobs, j) for j in range(num_jobs)]
    seen = [i for p in parts for i in p]
    assert sorted(seen) == ids  # full coverage, each id exactly once
    assert len(seen) == len(set(seen))  # no overlap
    assert split(ids, num_jobs) == dict(enumerate(parts))
    # balanced: part sizes differ by at most one
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    for j, p in enumerate(parts):
        assert p == sorted(p)  # input order kept
        assert all(owns(i, num_jobs, j) and owner(i, num_jobs) == j for i in p)


@pytest.mark.parametrize("num_jobs", [1, 2, 3, 5, 8])
def test_ids_with_gaps_and_any_order_split_the_same_way(num_jobs):
    # skipped rows keep their numbers: the ids a job gets are the same whichever rows are
    # usable, in whatever order they come, and on whichever machine the job runs
    rng = random.Random(num_jobs)
    full = list(range(500))
    some = sorted(rng.sample(full, 300))
    shuffled = some[:]
    rng.shuffle(shuffled)
    for j in range(num_jobs):
        a = job_ids(full, num_jobs, j)
        b = job_ids(some, num_jobs, j)
        c = job_ids(shuffled, num_jobs, j)
        assert b == [i for i in a if i in set(some)]
        assert sorted(c) == b
    # a sample's owner depends only on (id, num_jobs): stable across calls and processes
    assert [owner(i, num_jobs) for i in some] == [i % num_jobs for i in some]


def test_large_ids_and_bad_arguments():
    assert owner(10**12 + 5, 8) == 5
    assert job_ids([10**15, 10**15 + 1], 2, 1) == [10**15 + 1]
    for num_jobs, job_index in [(0, 0), (2, 2), (2, -1), (-1, 0), (3, 7)]:
        with pytest.raises(ValueError, match="dist.job_index"):
            check(num_jobs, job_index)
        with pytest.raises(ValueError):
            writer_tag(num_jobs, job_index)
        with pytest.raises(ValueError):
            job_ids([1, 2], num_jobs, job_index)
    with pytest.raises(ValueError, match=">= 0"):
        owner(-1, 2)


def test_writer_tags_are_unique_and_safe_shard_prefixes():
    pairs = [
        (n, j) for n in list(range(1, 130)) + [999, 1000, 1001, 10000, 10001] for j in range(n)
    ]
    tags = {writer_tag(n, j): (n, j) for n, j in pairs}
    assert len(tags) == len(pairs)  # one tag per (num_jobs, job_index), across splits too
    assert writer_tag(1, 0) == ""
    assert writer_tag(4, 1) == "j0001of0004"
    assert writer_tag(10001, 10000) == "j10000of10001"
    for tag in tags:
        assert re.fullmatch(r"(j\d+of\d+)?", tag)  # letters and digits: a file-name part
    # each job's shards and commit log live under its own name: no two jobs share a file,
    # and a job finds its own shards by its folder
    from hsdump.store.commits import Commits, log_path, shard_name

    sample = list(tags)[:: max(1, len(tags) // 400)] + ["", "j0001of0004", "j0001of0040"]
    c = Commits(version=2)
    for t in sample:
        c._add_shard(
            {
                "shard": shard_name(t, 7),
                "bytes": 1,
                "sha256": "0",
                "ids": [],
                "lengths": [],
                "masked": [],
            },
            "test",
        )
    for t in sample:
        assert c.writer_shards(t) == [shard_name(t, 7)]
    assert len({log_path(Path("/d"), t) for t in sample}) == len(set(sample))


def test_config_schema_accepts_the_dist_keys():
    from hsdump.config import DistConfig

    assert DistConfig().num_jobs == 1 and DistConfig().job_index == 0
    DistConfig(num_jobs=4, job_index=3)
    with pytest.raises(ValueError, match="dist.job_index=4 with dist.num_jobs=4"):
        DistConfig(num_jobs=4, job_index=4)
