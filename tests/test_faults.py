"""Interruptions and storage faults with a real CPU engine: nothing committed is lost, nothing
half-written is read, and the same command resumes without recomputing committed samples."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from factories import ROOT, committed, shard_mtimes

from hsdump.store.reader import HsdumpDataset
from hsdump.store.writer import DatasetWriter, WriteError
from hsdump.tools.verify import verify

ARGS = [
    "dataset.max_samples=16",
    "dataset.max_seq_len=64",
    "output.shard_bytes=40000",
    "progress=false",
    "dataset.on_bad_row=skip",
]


def extract(out, *extra, fault=None, wait=True):
    env = dict(os.environ)
    env.pop("HSDUMP_FAULT", None)
    if fault:
        env["HSDUMP_FAULT"] = fault
    cmd = [sys.executable, "extract.py", *ARGS, f"output.dir={out}", *extra]
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    if not wait:
        return p
    out_text, _ = p.communicate(timeout=600)
    return p.returncode, out_text


def same_dataset(a, b):
    da, db = HsdumpDataset(str(a)), HsdumpDataset(str(b))
    assert da.ids == db.ids and len(da) > 0
    for sid in da.ids:
        ra, rb = da.get(sid), db.get(sid)
        assert torch.equal(ra["input_ids"], rb["input_ids"])
        assert torch.equal(ra["loss_mask"], rb["loss_mask"])
        for x, y in zip(ra["hidden_states"], rb["hidden_states"]):
            assert float((x.float() - y.float()).norm() / y.float().norm()) < 0.01


@pytest.mark.engine
def test_kill_9_at_every_stage_then_resume(tmp_path, tiny_llama):
    ref, out = tmp_path / "ref", tmp_path / "out"
    rc, log = extract(ref)
    assert rc == 0, log[-3000:]

    # 1. during engine start: kill as soon as SGLang's processes exist
    p = extract(out, wait=False)
    deadline = time.time() + 120
    while time.time() < deadline and not psutil.Process(p.pid).children(recursive=True):
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert committed(out) == {}

    # 2. mid-run, after the 5th captured sample; 3. a shard written but not renamed;
    # 4. renamed but its commit record not yet appended; 5. a commit record half written
    # (torn: ignored by readers, cut by the resumed writer)
    for fault in ("sample@5", "before_rename@2", "before_record@2", "mid_record@2"):
        before = committed(out)
        stamps = shard_mtimes(out) if before else {}
        rc, log = extract(out, fault=fault)
        assert rc == -signal.SIGKILL, (fault, log[-2000:])
        after = committed(out)
        assert set(before) <= set(after), fault  # nothing committed is ever lost
        assert all(shard_mtimes(out)[n] == t for n, t in stamps.items())  # nor rewritten
        HsdumpDataset(str(out))  # always readable

        if fault == "mid_record@2":
            assert (Path(out) / "commits/main.jsonl").read_bytes()[-1:] != b"\n"  # torn
    assert len(after) < len(committed(ref))

    rc, log = extract(out)
    assert rc == 0, log[-3000:]
    assert f"already committed before this run: {len(after)}" in log
    assert (Path(out) / "commits/main.jsonl").read_bytes()[-1:] == b"\n"  # the tear was cut
    same_dataset(ref, out)
    assert verify(str(out)).ok

    # 6. killed while compacting index.json at the end: every sample is committed (the logs
    # hold them), the old index (or none) stays valid, and the re-run has nothing to do
    out2 = tmp_path / "out2"
    rc, log = extract(out2, fault="before_compact@1")
    assert rc == -signal.SIGKILL, log[-2000:]
    assert not (out2 / "index.json").exists()
    assert committed(out2).keys() == committed(ref).keys()
    same_dataset(ref, out2)
    rc, log = extract(out2)
    assert rc == 0 and "nothing to do" in log, log[-2000:]
    assert json.loads((out2 / "index.json").read_text())["format_version"] == 2
    assert verify(str(out2)).ok


@pytest.mark.engine
def test_sigterm_commits_what_is_complete_and_says_how_to_resume(tmp_path, tiny_llama):
    out = tmp_path / "out"
    # one sample in flight at a time, so the stop leaves work undone
    rc, log = extract(out, "engine.inflight_tokens=64", fault="sample@4:TERM")
    assert rc == 3, log[-3000:]
    assert "stopped by SIGTERM" in log and "run the same command again to resume" in log
    n = len(committed(out))
    assert n >= 4
    rc, log = extract(out)
    assert rc == 0 and f"already committed before this run: {n}" in log


@pytest.mark.engine
def test_engine_death_is_noticed_and_reported(tmp_path, tiny_llama):
    out = tmp_path / "out"
    p = extract(out, "dataset.max_samples=100", "dataset.max_seq_len=256", wait=False)
    deadline = time.time() + 180
    while time.time() < deadline and not committed(out):
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
            str(mnt / "ds"),
            {"layers": layers},
            {"k": 1},
            layers=layers,
            hidden_size=H,
            shard_bytes=100_000,
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
            str(mnt / "ds"),
            {"layers": layers},
            {"k": 1},
            layers=layers,
            hidden_size=H,
            shard_bytes=100_000,
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
        rc, log = extract(mnt / "ds")
        assert rc == 2 and "are free" in log and "output.space_check=warn" in log
        assert "starting sglang" not in log
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
