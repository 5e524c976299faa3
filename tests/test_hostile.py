"""Issue 24: a received folder is untrusted input. Every hostile case (tests/hostile.py: FIFOs,
devices and links to outside in place of each file kind, crafted numbers, random byte flips and
truncations of every file kind) opened by every tool ends in a clear message, in bounded time
and memory, and nothing outside the folder is read."""

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import hostile
import pytest

MEMORY_CAP = 6 << 30
"""Address space of the driver: torch alone maps ~3.3 GB; reading /dev/zero would pass it."""
RSS_CAP_MB = 2500  # the one driver process's peak over all cases and tools: 1,678 MB on a clean CI run (torch, export), far below a read of /dev/zero (the 6 GiB cap)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    expect = hostile.build(root)
    out = root / "results.json"

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
    p = subprocess.run(
        [sys.executable, hostile.__file__, str(root / "cases"), str(out)],
        preexec_fn=cap,
        env=env,
        capture_output=True,
        text=True,
        timeout=len(expect) * len(hostile.TOOLS) * hostile.CASE_SECONDS,
        cwd=root,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return expect, json.loads(out.read_text())


def test_every_case_ends_in_bounded_time_and_memory(results):
    expect, res = results
    assert len(res) == len(expect) * len(hostile.TOOLS)
    crashed = {k: v["crash"] for k, v in res.items() if v["crash"]}
    assert not crashed, "\n".join(f"{k}: {v}" for k, v in crashed.items())
    worst = max(res.values(), key=lambda v: v["seconds"])
    assert worst["seconds"] < hostile.CASE_SECONDS
    assert max(v["max_rss_mb"] for v in res.values()) < RSS_CAP_MB


def test_nothing_outside_the_folder_is_read(results):
    _, res = results
    leaked = [k for k, v in res.items() if v["canary"]]
    assert not leaked


def test_refusals_are_one_clear_line(results):
    _, res = results
    for key, v in res.items():
        tool = key.split("/")[1]
        assert v["rc"] in ({0, 1} if tool in ("verify", "inspect") else {0, 2}) | {2}, (key, v)
        if v["rc"] == 2:
            err = v["stderr"]
            assert err.strip() and "Traceback" not in err, (key, err)
            assert len(err.strip().splitlines()) <= 3, (key, err)


def test_the_valid_dataset_passes_every_tool(results):
    _, res = results
    for tool in hostile.TOOLS:
        v = res[f"good/{tool}"]
        assert v["rc"] == 0, (tool, v)
        assert "warning" not in v["stderr"], (tool, v["stderr"])


@pytest.mark.parametrize("name,words", [(n, w) for n, _, w in hostile.named_cases(Path("/x"))])
def test_each_hostile_case_is_named(results, name, words):
    """verify reports the case (rc 1), naming it; a tool that refuses names it too; a file
    only vocab reads (token_freq.json) is vocab's to refuse."""
    _, res = results
    judge = "vocab" if "token-freq" in name else "verify"
    v = res[f"{name}/{judge}"]
    assert v["rc"] in (1, 2), v
    for tool in hostile.TOOLS:
        r = res[f"{name}/{tool}"]
        if r["rc"] and words:
            assert words in r["stdout"] + r["stderr"], (tool, r)


def test_a_corrupt_index_is_ignored_with_a_warning(results):
    """The logs hold every record: readers go on, and say so once."""
    _, res = results
    for tool in ("reader", "inspect", "export"):
        v = res[f"index-corrupt/{tool}"]
        assert v["rc"] == 0 and "index.json does not parse" in v["stderr"], (tool, v)
    assert res["index-corrupt/reader"]["stdout"] == res["good/reader"]["stdout"]
