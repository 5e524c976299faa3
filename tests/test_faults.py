"""Interruptions and storage faults: nothing committed is lost, nothing half-written is read,
and the same command resumes without recomputing committed samples. hsdump's own bookkeeping
runs on the dry engine (tests/harness.py's DRY: its rows are a deterministic function of the
token ids, so two runs' datasets are equal); only the engine's death needs a real CPU engine."""

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from factories import committed, rows_manifest, shard_mtimes
from harness import DRY, extract

from hsdump.store.reader import HsdumpDataset
from hsdump.store.writer import DatasetWriter, WriteError
from hsdump.tools.verify import verify

ARGS = [
    "dataset.max_samples=16",
    "dataset.max_seq_len=64",
    "output.shard_bytes=40000",
    "dataset.on_bad_row=skip",
]
DRY_ARGS = [*ARGS, DRY]


def same_dataset(a, b):
    """Two dry runs' datasets hold the same samples, bit for bit (dry rows are deterministic)."""
    da, db = HsdumpDataset(str(a), allow_dry=True), HsdumpDataset(str(b), allow_dry=True)
    assert da.ids == db.ids and len(da) > 0
    for sid in da.ids:
        ra, rb = da.get(sid), db.get(sid)
        assert torch.equal(ra["input_ids"], rb["input_ids"])
        assert torch.equal(ra["loss_mask"], rb["loss_mask"])
        assert len(ra["hidden_states"]) == len(rb["hidden_states"]) > 0
        for x, y in zip(ra["hidden_states"], rb["hidden_states"]):
            assert torch.equal(x, y), sid


def test_kill_9_at_every_stage_then_resume(tmp_path):
    ref, out = tmp_path / "ref", tmp_path / "out"
    rc, log = extract(out=ref, args=DRY_ARGS)
    assert rc == 0, log[-3000:]

    # 1. before anything is written. (The real engine's version killed the run during engine
    # start, as soon as SGLang's processes existed; the dry engine has no child processes, so
    # the equivalent point is the first captured sample: the engine is up, nothing written.)
    rc, log = extract(out=out, args=DRY_ARGS, fault="sample@1")
    assert rc == -signal.SIGKILL, log[-2000:]
    assert committed(out) == {}

    # 2. mid-run, after the 5th captured sample; 3. a shard written but not renamed;
    # 4. renamed but its commit record not yet appended; 5. a commit record half written
    # (torn: ignored by readers, cut by the resumed writer)
    for fault in ("sample@5", "before_rename@2", "before_record@2", "mid_record@2"):
        before = committed(out)
        stamps = shard_mtimes(out) if before else {}
        rc, log = extract(out=out, args=DRY_ARGS, fault=fault)
        assert rc == -signal.SIGKILL, (fault, log[-2000:])
        after = committed(out)
        assert set(before) <= set(after), fault  # nothing committed is ever lost
        assert all(shard_mtimes(out)[n] == t for n, t in stamps.items())  # nor rewritten
        HsdumpDataset(str(out), allow_dry=True)  # always readable

        if fault == "mid_record@2":
            assert (Path(out) / "commits/main.jsonl").read_bytes()[-1:] != b"\n"  # torn
    assert len(after) < len(committed(ref))

    rc, log = extract(out=out, args=DRY_ARGS)
    assert rc == 0, log[-3000:]
    assert f"already committed before this run: {len(after)}" in log
    assert (Path(out) / "commits/main.jsonl").read_bytes()[-1:] == b"\n"  # the tear was cut
    same_dataset(ref, out)
    assert verify(str(out)).ok

    # 6. killed while compacting index.json at the end: every sample is committed (the logs
    # hold them), the old index (or none) stays valid, and the re-run has nothing to do
    out2 = tmp_path / "out2"
    rc, log = extract(out=out2, args=DRY_ARGS, fault="before_compact@1")
    assert rc == -signal.SIGKILL, log[-2000:]
    assert not (out2 / "index.json").exists()
    assert committed(out2).keys() == committed(ref).keys()
    same_dataset(ref, out2)
    rc, log = extract(out=out2, args=DRY_ARGS)
    assert rc == 0 and "nothing to do" in log, log[-2000:]
    assert json.loads((out2 / "index.json").read_text())["format_version"] == 2
    assert verify(str(out2)).ok


def test_sigterm_commits_what_is_complete_and_says_how_to_resume(tmp_path):
    out = tmp_path / "out"
    # one sample in flight at a time, so the stop leaves work undone (the dry engine takes its
    # samples one at a time anyway; the setting is kept as the real run had it)
    rc, log = extract("engine.inflight_tokens=64", out=out, args=DRY_ARGS, fault="sample@4:TERM")
    assert rc == 3, log[-3000:]
    assert "stopped by SIGTERM" in log and "run the same command again to resume" in log
    n = len(committed(out))
    assert n >= 4
    rc, log = extract(out=out, args=DRY_ARGS)
    assert rc == 0 and f"already committed before this run: {n}" in log


# real engine: what is killed is SGLang's scheduler process, and SGLang reports its death
@pytest.mark.engine
def test_engine_death_is_noticed_and_reported(tmp_path, tiny_llama):
    out = tmp_path / "out"
    p = extract(
        "dataset.max_samples=100",
        "dataset.max_seq_len=256",
        out=out,
        args=ARGS,
        wait=False,
        new_session=True,
    )
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not committed(out) and p.poll() is None:
            time.sleep(0.05)
        victims = [
            c
            for c in psutil.Process(p.pid).children(recursive=True)
            if "scheduler" in " ".join(c.cmdline()).lower() or "scheduler" in c.name()
        ]
        assert victims, [c.cmdline() for c in psutil.Process(p.pid).children(recursive=True)]
        t = time.time()
        victims[0].kill()
        text, _ = p.communicate(timeout=120)
        assert time.time() - t < 60
    finally:
        if p.poll() is None:  # a failed assertion above: the run and SGLang's children go
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 3, text[-3000:]
    assert "the SGLang engine died" in text and "run the same command again to resume" in text
    ds = HsdumpDataset(str(out))
    assert 0 < len(ds) < 100


def tmpfs(path, size):
    path.mkdir(exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return r.returncode == 0


def test_disk_full_leaves_a_valid_resumable_dataset(tmp_path, monkeypatch):
    mnt = tmp_path / "small"
    real = tmpfs(mnt, "300k")
    if not real:  # no permission to mount here: fail the write call itself instead
        mnt.mkdir(exist_ok=True)
        import hsdump.store.writer as w

        orig = w.os.fsync
        state = {"n": 0}

        def full(fd):
            state["n"] += 1
            if state["n"] == 4 and not state.get("freed"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return orig(fd)

        monkeypatch.setattr(w.os, "fsync", full)
    try:
        H, layers = 256, [1, 2, 3]

        def samples(start, n):
            for sid in range(start, start + n):
                hs = [torch.randn(64, H) for _ in layers]
                yield sid, list(range(64)), [1] * 64, hs

        w = DatasetWriter(
            str(mnt / "ds"), rows_manifest(layers=layers, hidden_size=H), shard_bytes=100_000
        )
        with pytest.raises(WriteError) as e:
            for s in samples(0, 40):
                w.add(*s)
            w.close()
        assert "No space left on device" in str(e.value)
        assert "run the same command again to resume" in str(e.value)
        ds = HsdumpDataset(str(mnt / "ds"))  # what was committed is intact and readable
        assert 0 < len(ds) < 40
        assert not [p for p in (mnt / "ds").rglob("*") if ".tmp." in p.name]
        n = len(ds)
        if real:
            subprocess.run(["mount", "-o", "remount,size=20m", str(mnt)], check=True)
        else:
            state["freed"] = True
        w = DatasetWriter(
            str(mnt / "ds"), rows_manifest(layers=layers, hidden_size=H), shard_bytes=100_000
        )
        assert len(w.committed) == n
        for s in samples(0, 40):
            if s[0] not in w.committed:
                w.add(*s)
        w.close()
        assert HsdumpDataset(str(mnt / "ds")).ids == list(range(40))
    finally:
        if real:
            subprocess.run(["umount", "-l", str(mnt)])


def test_space_estimate_refuses_before_the_engine(tmp_path):
    mnt = tmp_path / "tiny"
    if not tmpfs(mnt, "64k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        rc, log = extract(out=mnt / "ds", args=DRY_ARGS)
        assert rc == 2 and "are free" in log and "output.space_check=warn" in log
        # no engine was started, dry or real (pipeline.start_engine logs "engine: ...")
        assert "engine: dry" not in log and "dry engine" not in log, log[-2000:]
        assert "starting SGLang" not in log
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
