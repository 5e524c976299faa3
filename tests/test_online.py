"""Train while capturing (issue 52): hsdump's producer against SpecForge 0.2.0's own online
classes, its wheel fetched as the other peer tests do (tests/test_export.py's _peer_root).

The fast tier runs the producer on the dry engine (the protocol is hsdump's: which sample goes
when, what is deleted when) beside a consumer made of SpecForge's own pieces: its
StreamingRefChannel reads refs.jsonl (each line parsed by its ref_from_dict into its SampleRef),
hsdump's store (SpecForge's FeatureStore interface) serves the tensors, and the consumer
acknowledges one optimizer window at a time as SpecForge's DPAckController does (store.abort of
each id, then the channel's consumed count). The slow tier (tests/test_online_train.py) runs
SpecForge's trainer itself.
"""

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from factories import ROOT, compose_config
from harness import extract
from test_export import _peer_root

from hsdump.online import folder as F

KIND = "dflash"
BATCH = 2


@pytest.fixture
def specforge(monkeypatch):
    """SpecForge 0.2.0's wheel on sys.path for this test; its modules dropped afterwards."""
    import sys

    monkeypatch.syspath_prepend(_peer_root("HSDUMP_SPECFORGE_SRC"))
    yield
    for name in list(sys.modules):
        if name.split(".")[0] == "specforge" or name == "hsdump.online.store":
            del sys.modules[name]


def shard_bytes(folder: Path) -> int:
    return F.shard_bytes(folder / F.STORE)


class Consumer(threading.Thread):
    """SpecForge's channel and hsdump's store, acknowledging whole windows of BATCH refs (a
    restarted one skips what was acknowledged, as SpecForge's ledger does); `fail_after`
    windows: SpecForge's consumer-failure file instead; `hold`: reads, never acknowledges;
    `silent`: never beats."""

    def __init__(self, folder: Path, fail_after=None, silent=False, hold=False, kind=KIND):
        super().__init__(daemon=True)
        self.folder, self.fail_after, self.silent, self.hold = folder, fail_after, silent, hold
        self.kind = kind
        self.consumed, self.peak, self.windows, self.error = [], 0, 0, None
        self.halt = threading.Event()

    def run(self):
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - the test reads it
            self.error = e

    def _run(self):
        from specforge.runtime.data_plane.ref_serialization import ref_to_dict
        from specforge.runtime.data_plane.streaming_ref_channel import StreamingRefChannel

        from hsdump.online.store import HsdumpFeatureStore

        while not (self.folder / F.PLAN).exists():
            if self.halt.wait(0.02):
                return
        ch = StreamingRefChannel(str(self.folder / F.REFS))
        ch.publish_consumer_quantum(BATCH, allow_existing=True)
        store, window, lines = HsdumpFeatureStore(self.folder), [], 0
        store.book.read_acks()
        acked = set(store.book.acked)
        while not self.halt.is_set():
            if not self.silent:
                F.beat(self.folder / F.CONSUMER_ALIVE)
            self.peak = max(self.peak, shard_bytes(self.folder))
            closed = ch.is_closed()  # before the poll: a close after it leaves refs to read
            refs = ch.poll()
            raw, _ = F.read_lines(self.folder / F.REFS)
            for ref in refs:  # every line is SpecForge's SampleRef, and its own JSON again
                assert ref_to_dict(ref) == json.loads(raw[lines])
                lines += 1
                if ref.sample_id in acked:
                    continue
                tensors, handle = store.get(ref)
                assert set(tensors) == set(F.KEYS[self.kind])
                if self.kind == KIND:
                    assert tensors["hidden_states"].shape[:2] == tensors["input_ids"].shape
                store.release(handle)
                window.append(ref.sample_id)
            while len(window) >= BATCH and not self.hold:
                if self.fail_after is not None and self.windows >= self.fail_after:
                    ch.mark_consumer_failed("RuntimeError: the trainer broke")
                    return
                done, window = window[:BATCH], window[BATCH:]
                for sid in done:
                    store.abort(sid, reason="optimizer-boundary-durable-ack")
                ch.mark_consumed(len(done))
                self.consumed += done
                self.windows += 1
            if closed and not refs:
                for sid in window:  # SpecForge's dropped tail: aborted, never trained
                    store.abort(sid, reason="end-of-stream tail")
                ch.mark_consumer_done()
                return
            time.sleep(0.01)


def producer_cfg(folder: Path, *over, kind=KIND, online=True):
    """The dry engine's capture of 12 samples for `kind`: online on `folder`, or (`online`
    false) offline into `folder`."""
    from hsdump.cli import register_resolvers
    from hsdump.config import register_configs, to_config

    register_configs()
    register_resolvers()
    base = ["engine=dry", "dataset.max_samples=12", "dataset.max_seq_len=256",
            f"capture.kinds=[{kind}]", "progress=false",
            *(["capture.final=[post_norm]"] if kind == "eagle3" else [])]  # fmt: skip
    if online:
        base += ["online=specforge", f"online.folder={folder}", f"online.kind={kind}",
                 "online.epochs=2", f"online.batch_size={BATCH}", "online.peer_timeout_s=30"]  # fmt: skip
    else:
        base += [f"output.dir={folder}"]
    return to_config(compose_config(*base, *over))


def least_cap(tmp_path) -> int:
    """The cap hsdump asks for at least (its refusal names it), measured on a cap of 1."""
    from hsdump.errors import Refusal
    from hsdump.online.producer import run

    with pytest.raises(Refusal, match=r"online.cap_bytes >= (\d+)") as e:
        run(producer_cfg(tmp_path / "probe", "online.cap_bytes=1"))
    return int(str(e.value).rsplit(">= ", 1)[1].split(",")[0])


def test_capped_capture_is_consumed_once_an_epoch_and_leaves_nothing(tmp_path, specforge):
    from hsdump.online.producer import run

    need = least_cap(tmp_path)
    cap = 2 * need  # the shard size follows the cap (cap // 4): 2x the floor holds both
    folder = tmp_path / "f"
    c = Consumer(folder)
    c.start()
    summary = run(producer_cfg(folder, f"online.cap_bytes={cap}"))
    c.join(60)
    assert c.error is None and not c.is_alive()
    plan = json.loads((folder / F.PLAN).read_text())
    n = plan["samples_per_epoch"]
    assert plan["quantum"] == BATCH and n >= 8
    assert 0 < c.peak <= cap, (c.peak, cap)  # sampled while it ran
    assert summary["peak_accounted_bytes"] <= cap
    assert summary["engine_starts"] == 1  # one engine for both epochs
    # every sample once an epoch, each epoch with new ids, in SpecForge's offline order
    pub = F.published_ids(folder)
    assert len(pub) == len(set(pub)) == 2 * n == summary["samples_published"]
    assert c.consumed + [i for i in pub if i not in c.consumed] == pub
    assert len(c.consumed) == 2 * n - (2 * n) % BATCH
    epochs = [
        [F.parse_sample_id(s)[1] for s in pub if F.parse_sample_id(s)[0] == e] for e in (0, 1)
    ]
    assert sorted(epochs[0]) == sorted(epochs[1]) and epochs[0] != epochs[1]
    from hsdump.online.producer import epoch_order

    assert epochs == [epoch_order(epochs[0], e, 0) for e in (0, 1)]
    # the store is empty, SpecForge's schedule is the run's, the stream closed
    assert shard_bytes(folder) == 0
    sched = json.loads(F.side(folder, F.SCHEDULE))
    assert sched["total_steps"] == 2 * n // BATCH and sched["prompt_epochs"] == 2
    assert F.side(folder, F.CLOSED) is not None and F.side(folder, F.FAILED) is None


def test_the_cap_is_awaited_in_the_request_loop_and_the_trainer_frees_it(tmp_path, specforge):
    """A consumer that stops acknowledging holds the capture at the cap (it waits, it does not
    fail); acknowledging again lets it finish."""
    from hsdump.online.producer import run

    cap = 2 * least_cap(tmp_path)
    folder = tmp_path / "f"
    c = Consumer(folder, hold=True)
    c.start()
    out = {}

    def watch():  # the producer runs in the main thread (its engine installs signal handlers)
        while not (folder / F.PLAN).exists():
            time.sleep(0.02)
        time.sleep(2.0)
        out["held"] = (len(F.published_ids(folder)), shard_bytes(folder))
        c.halt.set()
        c.join()
        out["r"] = Consumer(folder)  # acknowledges from the first ref on
        out["r"].start()

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    s = run(producer_cfg(folder, f"online.cap_bytes={cap}"))
    w.join(30)
    out["r"].join(60)
    plan = json.loads((folder / F.PLAN).read_text())
    published, held = out["held"]
    assert 0 < held <= cap and published < 2 * plan["samples_per_epoch"]
    assert s["gate_wait_s"] > 1.0  # it waited at the cap
    assert s["samples_published"] == 2 * plan["samples_per_epoch"]
    assert shard_bytes(folder) == 0


def test_a_failed_trainer_stops_the_capture(tmp_path, specforge):
    from hsdump.online.producer import Stop, run

    cap = 2 * least_cap(tmp_path)
    folder = tmp_path / "f"
    c = Consumer(folder, fail_after=1)
    c.start()
    with pytest.raises(Stop, match="the trainer failed: RuntimeError: the trainer broke"):
        run(producer_cfg(folder, f"online.cap_bytes={cap}"))
    c.join(10)
    # what was committed and not acknowledged is still there, for a resumed trainer
    book = F.ShardBook(folder)
    book.refresh()
    book.read_acks()
    unacked = [s for s in F.published_ids(folder) if s not in book.acked]
    assert unacked and all(book.shard_of[s][0].exists() for s in unacked)
    assert F.side(folder, F.FAILED) is None  # the trainer's failure is not the producer's


def test_a_silent_trainer_stops_the_capture(tmp_path, specforge):
    from hsdump.online.producer import Stop, run

    folder = tmp_path / "f"
    c = Consumer(folder, silent=True, hold=True)
    c.start()
    cfg = producer_cfg(folder, "online.peer_timeout_s=1", "engine.dry_tokens_per_s=400")
    with pytest.raises(Stop, match="has not been heard from"):
        run(cfg)
    c.halt.set()


def test_a_stopped_capture_stops_specforges_consumer(tmp_path, specforge):
    """A producer that stops (or fails) says so in SpecForge's producer-failure file, which
    SpecForge's own queue (what its consumer reads through) raises on; a refused command
    (bad input, nothing run) leaves the folder as it was."""
    from specforge.runtime.data_plane.streaming_ref_channel import (
        StreamingRefChannel,
        StreamingRefQueue,
    )

    folder = tmp_path / "f"
    bad = tmp_path / "no-such-model"
    rc, out = extract(f"online.folder={folder}", "online=specforge", f"model.path={bad}",
                      "engine=dry", f"capture.kinds=[{KIND}]", timeout=120)  # fmt: skip
    assert rc == 2  # refused before anything is published: the folder is left untouched
    assert F.side(folder, F.FAILED) is None
    # stopped while running (SIGTERM: it commits what it holds and stops)
    rc, out = extract(f"online.folder={folder}", "online=specforge", "engine=dry",
                      "dataset.max_samples=8", f"capture.kinds=[{KIND}]", fault="sample@3:TERM",
                      timeout=120)  # fmt: skip
    assert rc == 3, out
    failure = F.side(folder, F.FAILED)
    assert failure and failure.startswith("hsdump producer stopped: ")
    q = StreamingRefQueue(StreamingRefChannel(str(folder / F.REFS)), poll_s=0.01)
    # the consumer first reads what was published before the stop (how many depends on where
    # the signal found the run: batches of BATCH while there are), then the queue raises
    got = []
    with pytest.raises(RuntimeError, match="producer failed: hsdump producer stopped"):
        for _ in range(8 // BATCH + 1):
            got += q.get(BATCH)
    assert len(got) < 8, got  # stopped at sample 3: never the whole dataset


def test_killed_capture_resumes_and_publishes_each_sample_once(tmp_path, specforge):
    """(On fp8 shards: the store dequantizes them as hsdump's reader does.)"""
    folder = tmp_path / "f"
    c = Consumer(folder)
    c.start()
    args = ["online=specforge", f"online.folder={folder}", "engine=dry",
            "dataset.max_samples=12", "dataset.max_seq_len=256", f"capture.kinds=[{KIND}]",
            "online.epochs=2", f"online.batch_size={BATCH}", "online.peer_timeout_s=30",
            "output.dtype=fp8"]  # fmt: skip
    rc, out = extract(*args, fault="sample@15", timeout=120)  # SIGKILL in epoch 1
    assert rc == -9, out
    first = F.published_ids(folder)
    assert 0 < len(first)
    rc, out = extract(*args, timeout=120)
    assert rc == 0, out
    c.join(60)
    assert c.error is None and not c.is_alive()
    pub = F.published_ids(folder)
    n = json.loads((folder / F.PLAN).read_text())["samples_per_epoch"]
    assert pub[: len(first)] == first and len(pub) == len(set(pub)) == 2 * n
    assert sorted(c.consumed) == sorted(pub[: len(c.consumed)]) and len(c.consumed) == 2 * n
    assert shard_bytes(folder) == 0


def test_refusals_name_the_fix(tmp_path):
    from hsdump.errors import Refusal
    from hsdump.online.producer import run

    with pytest.raises(Refusal, match=r"capture.kinds=\[dspark\]"):
        run(producer_cfg(tmp_path / "a", "online.kind=dspark"))
    with pytest.raises(Refusal, match="dist.num_jobs=1"):
        run(producer_cfg(tmp_path / "b", "dist.num_jobs=2"))
    folder = tmp_path / "c"
    (folder / "control").mkdir(parents=True)
    F.write_side(folder, F.DONE, "")
    with pytest.raises(Refusal, match="use a new online.folder"):
        run(producer_cfg(folder))


def test_capture_engine_awaits_the_gate_beside_its_requests_in_flight():
    """CaptureEngine's request loop (hsdump's, on SGLang's event loop): while the gate holds
    the next request, the requests in flight still finish and reach the sink; the gate's
    error stops the run. `_one` (the request to SGLang) stands in: the order is hsdump's."""
    import asyncio
    from types import SimpleNamespace

    from hsdump.capture.base import Request
    from hsdump.capture.engine import CaptureEngine

    eng = CaptureEngine.__new__(CaptureEngine)
    eng.cfg = SimpleNamespace(inflight_tokens=10**6)
    eng._stop_requested, eng._died, eng._aborted = False, None, False
    events = []

    async def one(req):
        await asyncio.sleep(0.05 if req.sid == 0 else 0.0)
        events.append(("done", req.sid))
        return req.sid

    eng._one = one

    class Gate:
        async def wait(self, req):
            if req.sid == 1:  # held until sample 0, in flight, has reached the sink
                while ("sink", 0) not in events:
                    await asyncio.sleep(0.005)
            if req.sid == 3:
                raise RuntimeError("the trainer failed")
            events.append(("admit", req.sid))

    reqs = iter([Request(i, [1, 2, 3]) for i in range(5)])
    with pytest.raises(RuntimeError, match="the trainer failed"):
        drive = eng._drive(reqs, lambda s: events.append(("sink", s)), gate=Gate())
        asyncio.run(asyncio.wait_for(drive, 10))  # a gate awaited in line would hang here
    assert events.index(("sink", 0)) < events.index(("admit", 1))
    assert ("sink", 2) in events and ("admit", 3) not in events and ("admit", 4) not in events


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "domino", "dspark"])
def test_the_store_serves_each_kind_what_specforge_reads_offline_from_its_export(
    kind, tmp_path, specforge, monkeypatch
):
    """Every kind SpecForge trains online: hsdump's store hands its consumer, for each sample,
    exactly the tensors SpecForge's own offline loader reads from `hsdump export --to
    specforge --kind K` of the same dataset (its reader, normalizer and collator, batch 1)."""
    from test_export import KLENS, kinds_dataset, specforge_loader

    import hsdump.tools.export as ex
    from hsdump.online.producer import kind_plan
    from hsdump.store.commits import read_manifest

    monkeypatch.setenv("SPECFORGE_VALIDATE_OFFLINE_FEATURES", "1")
    from specforge.runtime.data_plane.ref_serialization import ref_from_dict

    from hsdump.online.store import HsdumpFeatureStore

    folder = tmp_path / "f"
    ds = kinds_dataset(F.epoch_dir(folder, 0))
    dest = tmp_path / "ex"
    assert ex.export(str(ds), str(dest), "specforge", kind=kind, progress=False)["written"] == 5
    offline = {sorted(KLENS)[i]: t for i, t in specforge_loader(dest, kind, max_len=64)}
    plan = dict(kind=kind, max_length=64, **kind_plan(read_manifest(ds), kind))
    (folder / F.PLAN).write_text(json.dumps(plan))
    store = HsdumpFeatureStore(folder)
    store.book.refresh()
    for sid, n in KLENS.items():
        name = F.sample_id(0, sid)
        shard = store.book.shard_of[name][0].relative_to(ds).as_posix()
        ref = ref_from_dict(F.ref_dict(kind, 0, sid, shard, n, 0))
        got, _ = store.get(ref)
        assert set(got) == set(F.KEYS[kind])
        for key, t in got.items():
            assert torch.equal(t, offline[sid][key]), (sid, key)
    # a float32 trainer (model.torch_dtype): the same tensors, the float ones in float32
    store32 = HsdumpFeatureStore(folder, dtype="float32")
    store32.book.refresh()
    got, _ = store32.get(ref)
    for key, t in got.items():
        want = offline[sid][key]
        assert t.dtype == (torch.float32 if want.is_floating_point() else want.dtype), key
        assert torch.equal(t, want.to(t.dtype)), key
    assert any(v.is_floating_point() for v in got.values())


def test_a_killed_capture_stops_specforges_consumer(tmp_path, specforge):
    """The consumer command's watchdog: a producer heartbeat silent past --producer-timeout
    (a SIGKILLed capture beats no more) becomes SpecForge's producer-failure file, which its
    queue raises on; a closed stream is left alone."""
    import threading

    from specforge.runtime.data_plane.streaming_ref_channel import (
        StreamingRefChannel,
        StreamingRefQueue,
    )

    from hsdump.online.consumer import heartbeats

    folder = tmp_path / "f"
    F.beat(folder / F.PRODUCER_ALIVE)
    old = time.time() - 5
    os.utime(folder / F.PRODUCER_ALIVE, (old, old))
    stop = threading.Event()
    t = threading.Thread(target=heartbeats, args=(folder, 2.0, stop), daemon=True)
    t.start()
    t0 = time.time()
    while F.side(folder, F.FAILED) is None and time.time() - t0 < 10:
        time.sleep(0.05)
    stop.set()
    t.join()
    assert "hsdump producer silent for" in (F.side(folder, F.FAILED) or "")
    assert F.silent_for(folder / F.CONSUMER_ALIVE) < 5  # it beat meanwhile
    q = StreamingRefQueue(StreamingRefChannel(str(folder / F.REFS)), poll_s=0.01)
    with pytest.raises(RuntimeError, match="producer failed: hsdump producer silent"):
        q.get(BATCH)
    done = tmp_path / "g"  # the capture finished: its silence is not a failure
    F.beat(done / F.PRODUCER_ALIVE)
    os.utime(done / F.PRODUCER_ALIVE, (old, old))
    F.write_side(done, F.CLOSED, "")
    stop = threading.Event()
    t = threading.Thread(target=heartbeats, args=(done, 2.0, stop), daemon=True)
    t.start()
    time.sleep(1.5)
    stop.set()
    t.join()
    assert F.side(done, F.FAILED) is None


def test_each_acknowledged_id_is_written_once(tmp_path):
    """SpecForge's resumed consumer acknowledges its ledger's samples again: acks.jsonl keeps
    one line per id, and a shard goes once all of its samples are acknowledged."""
    folder = tmp_path / "f"
    ds = folder / "store" / "epoch0000"
    (ds / "commits").mkdir(parents=True)
    (ds / "shard-0.safetensors").write_bytes(b"x" * 10)
    rec = {"shard": "shard-0.safetensors", "ids": [0, 1], "lengths": [3, 4], "bytes": 10}
    (ds / "commits" / "w.jsonl").write_text(json.dumps(rec) + "\n")
    book = F.ShardBook(folder)
    book.refresh()
    a, b = F.sample_id(0, 0), F.sample_id(0, 1)
    assert book.ack([a]) == 0 and (ds / "shard-0.safetensors").exists()
    assert book.ack([a, a]) == 0  # again, as a resumed consumer does
    assert F.ShardBook(folder).ack([a, b]) == 10  # another process: sees a, frees the shard
    lines, _ = F.read_lines(folder / F.ACKS)
    assert [json.loads(x) for x in lines] == [a, b]


def consumer(folder: Path, *args, paths=(), timeout=300):
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, paths), str(ROOT)]))
    env.pop("HSDUMP_FORBID_ENGINE", None)
    cfg = ROOT / "docs" / "configs" / "online-dflash-cpu.yaml"
    return subprocess.run(
        [sys.executable, "-m", "hsdump.online.consumer", str(folder), "-c", str(cfg), *args],
        cwd=folder.parent, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_the_trainer_says_why_it_stopped_where_the_capture_sees_it(
    tmp_path, specforge, monkeypatch, capsys
):
    """Any exit of the consumer command but success writes SpecForge's consumer-failure file
    with the reason (the capture stops at its next request): a missing module (accelerate,
    which SpecForge's worker imports) and a drafter config on other layers are refused before
    anything starts, naming the fix; a trainer that dies inside SpecForge is reported too."""
    import sys

    from hsdump.online.consumer import main

    folder = tmp_path / "f"
    (folder / "control").mkdir(parents=True)
    plan = dict(kind=KIND, epochs=1, seed=0, serving_ids=[1, 2, 3, 4, 5], max_length=256)
    (folder / F.PLAN).write_text(json.dumps(plan))
    cfg = str(ROOT / "docs" / "configs" / "online-dflash-cpu.yaml")
    assert "accelerate" not in sys.modules  # SpecForge here, accelerate not
    assert main([str(folder), "-c", cfg]) == 2
    err = capsys.readouterr().err
    assert "accelerate.utils cannot be imported" in err
    assert "pip install --no-deps --target .specforge specforge==0.2.0 accelerate==1.15.0" in err
    assert "the trainer was refused: accelerate.utils" in F.side(folder, F.CONSUMER_FAILED)

    ac = _peer_root("HSDUMP_ACCELERATE_SRC")
    monkeypatch.syspath_prepend(ac)
    try:
        draft = tmp_path / "draft.json"
        draft.write_text(json.dumps({"dflash_config": {"target_layer_ids": [1, 2, 3]}}))
        assert main([str(folder), "-c", cfg, f"model.draft_model_config={draft}"]) == 2
        err = capsys.readouterr().err
        assert "dflash_config.target_layer_ids=[1, 2, 3]" in err and "[1, 2, 3, 4, 5]" in err
        assert "drafter trains and serves on the layers" in F.side(folder, F.CONSUMER_FAILED)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "accelerate"]:
            del sys.modules[name]

    # the right layers, but no architecture: SpecForge's trainer starts (once the capture's
    # schedule is there), then dies building the drafter (its own process: it starts gloo)
    draft.write_text(json.dumps({"dflash_config": {"target_layer_ids": [1, 2, 3, 4, 5]}}))
    sched = dict(version=1, total_steps=1, num_prompts=1, prompt_epochs=1, prompt_seed=0,
                 dp_size=1, batch_size=1, accumulation_steps=1)  # fmt: skip
    Path(str(F.refs_path(folder)) + F.SCHEDULE).write_text(json.dumps(sched))
    sf = _peer_root("HSDUMP_SPECFORGE_SRC")
    p = consumer(folder, f"model.draft_model_config={draft}", paths=[sf, ac], timeout=120)
    assert p.returncode != 0
    assert F.side(folder, F.CONSUMER_FAILED) == (
        "the trainer (python -m hsdump.online.consumer) died: ValueError: draft config must "
        "name exactly one architecture; got []"
    ), p.stderr[-2000:]


def test_the_consumer_bounds_its_checkpoints(tmp_path, specforge):
    """training.max_checkpoints=2 unless run.yaml sets it (SpecForge keeps every one)."""
    from specforge.config import load_config

    from hsdump.online.consumer import consumer_config

    cfg = ROOT / "docs" / "configs" / "online-dflash-cpu.yaml"
    plan = dict(kind=KIND, epochs=2, seed=3)
    got = consumer_config(load_config(str(cfg), []), tmp_path, plan)
    assert got.training.max_checkpoints == 2 and got.training.save_interval == 1
    assert got.training.num_epochs == 2 and got.training.prompt_seed == 3
    got = consumer_config(load_config(str(cfg), ["training.max_checkpoints=0"]), tmp_path, plan)
    assert got.training.max_checkpoints == 0


def test_the_consumer_loads_a_tied_targets_head_from_its_embedding(tmp_path, specforge):
    """A target whose LM head is its embedding (SmolLM2: no lm_head.weight in its files) gets
    model.lm_head_key=model.embed_tokens.weight where run.yaml leaves SpecForge's default; an
    untied target, or one that cannot be read, keeps it, and another key named is kept. On the H100 of 2026-12-07 SpecForge's
    trainer died on SmolLM2 without it: KeyError 'lm_head.weight' in TargetHead.load_weights."""
    from specforge.config import load_config

    from hsdump.online.consumer import TIED_HEAD_KEY, consumer_config, tied_head

    cfg = ROOT / "docs" / "configs" / "online-dflash-cpu.yaml"
    plan = dict(kind=KIND, epochs=2, seed=3)
    tied, untied, nested = tmp_path / "tied", tmp_path / "untied", tmp_path / "nested"
    for d, c in ((tied, {"tie_word_embeddings": True}), (untied, {"tie_word_embeddings": False}),
                 (nested, {"text_config": {"tie_word_embeddings": True}})):  # fmt: skip
        d.mkdir()
        (d / "config.json").write_text(json.dumps(c))
    assert tied_head({"target_model_path": str(nested)})
    assert not tied_head({"target_model_path": "org/model-on-the-hub"})

    def key(*over):
        return consumer_config(load_config(str(cfg), list(over)), tmp_path, plan).model.lm_head_key

    assert key(f"model.target_model_path={tied}") == TIED_HEAD_KEY
    assert key(f"model.target_model_path={untied}") == "lm_head.weight"
    assert key(f"model.target_model_path={tied}", "model.lm_head_key=my.head") == "my.head"


def test_eagle3_counts_are_specforges_offline_counts_in_its_order(tmp_path, specforge):
    """hsdump.online.vocab counts the loss-masked ids as SpecForge's offline trainer counts an
    export's files, in the same order, so SpecForge's map builder picks the same ids where
    counts tie (Counter.most_common keeps the first-counted); in id order it would not."""
    from collections import Counter

    from specforge.data.preprocessing import process_token_dict_to_mappings
    from specforge.training.vocab_mapping import count_effective_feature_tokens
    from test_export import KLENS, kind_sample, kinds_dataset

    import hsdump.tools.export as ex
    from hsdump.online.producer import file_order
    from hsdump.online.vocab import NoCounts, ordered_counts, specforge_map, write_counts

    ds = kinds_dataset(tmp_path / "ds")
    ex.export(str(ds), str(tmp_path / "ex"), "specforge", kind="eagle3", progress=False)
    theirs = count_effective_feature_tokens(str(tmp_path / "ex"))
    ours = ordered_counts(kind_sample(sid, KLENS[sid])[:2] for sid in file_order(list(KLENS)))
    assert ours == [[t, c] for t, c in theirs.items()]
    assert [t for t, _ in ours] != sorted(t for t, _ in ours)

    folder = tmp_path / "f"
    folder.mkdir()
    write_counts(folder, ours, len(KLENS), max(KLENS.values()))
    got = torch.load(specforge_map(folder, str(tmp_path / "c"), 20, 100, 64), weights_only=True)
    want = process_token_dict_to_mappings(Counter(theirs), 20, 100)
    assert torch.equal(got["d2t"], want[0]) and torch.equal(got["t2d"], want[1])
    by_id = process_token_dict_to_mappings(Counter(dict(sorted(theirs.items()))), 20, 100)
    assert not torch.equal(by_id[1], want[1])  # the ties: the order decides
    # a trainer that cuts the samples shorter would count other tokens: refused, with the fix
    with pytest.raises(NoCounts, match=r"set data.max_length >= 40"):
        specforge_map(folder, str(tmp_path / "c"), 20, 100, 32)
    with pytest.raises(NoCounts, match=r"model.vocab_mapping_path="):
        specforge_map(tmp_path, str(tmp_path / "c"), 20, 100, 64)


def test_an_eagle3_capture_gives_its_trainer_specforges_offline_vocabulary_map(tmp_path, specforge):
    """An EAGLE-3 capture through the folder (dry engine) writes its counts with its plan; the
    consumer command, given a run.yaml with no model.vocab_mapping_path, hands SpecForge the
    map its offline trainer derives from `hsdump export --to specforge` of an offline capture
    of the same samples (SpecForge refuses an online EAGLE-3 run without one)."""
    from specforge.config import load_config
    from specforge.data.preprocessing import process_token_dict_to_mappings
    from specforge.training.vocab_mapping import count_effective_feature_tokens

    import hsdump.tools.export as ex
    from hsdump.online.consumer import consumer_config, with_vocab_map
    from hsdump.online.producer import run
    from hsdump.pipeline import run as capture
    from hsdump.tiny import resolve_model_path

    folder = tmp_path / "f"
    c = Consumer(folder, kind="eagle3")
    c.start()
    cfg = producer_cfg(folder, kind="eagle3")
    run(cfg)
    c.join(60)
    assert c.error is None and not c.is_alive()
    capture(producer_cfg(tmp_path / "ds", kind="eagle3", online=False))
    ex.export(str(tmp_path / "ds"), str(tmp_path / "ex"), "specforge", kind="eagle3",
              progress=False, allow_dry=True)  # fmt: skip
    theirs = count_effective_feature_tokens(str(tmp_path / "ex"))
    doc = json.loads((folder / "token_freq.json").read_text())
    assert [[int(t), n] for t, n in doc["counts"].items()] == [[t, n] for t, n in theirs.items()]

    target = resolve_model_path(cfg.model.path)
    vocab = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"],
                                 "vocab_size": vocab, "draft_vocab_size": 64}))  # fmt: skip
    run_yaml = tmp_path / "run.json"
    run_yaml.write_text(json.dumps(dict(
        model=dict(target_model_path=target, draft_model_config=str(draft)),
        data=dict(hidden_states_path="unused", max_length=256, cache_dir=str(tmp_path / "cache")),
        training=dict(strategy="eagle3"))))  # fmt: skip
    plan = json.loads((folder / F.PLAN).read_text())
    got = with_vocab_map(consumer_config(load_config(str(run_yaml), []), folder, plan), folder,
                         plan)  # fmt: skip
    path = got.model.vocab_mapping_path
    assert Path(path).parent == tmp_path / "cache" / "vocab_mapping"
    mapping = torch.load(path, weights_only=True)
    want = process_token_dict_to_mappings(theirs, 64, vocab)
    assert torch.equal(mapping["d2t"], want[0]) and torch.equal(mapping["t2d"], want[1])
    # run.yaml's own map stands
    named = load_config(str(run_yaml), ["model.vocab_mapping_path=/maps/mine.pt"])
    assert with_vocab_map(named, folder, plan).model.vocab_mapping_path == "/maps/mine.pt"


@pytest.mark.parametrize("chunk", [1, 3, 4096])
def test_counts_in_counter_order_across_chunks(chunk):
    """ordered_counts, counting a chunk of samples at a time, gives the order and counts of a
    Counter updated sample by sample with each sample's distinct ids ascending (SpecForge's
    offline count), whatever the chunk."""
    from collections import Counter

    import numpy as np

    from hsdump.online.vocab import ordered_counts

    rng = np.random.default_rng(7)
    samples = []
    for n in rng.integers(1, 40, 25):
        ids = rng.integers(0, 300 if len(samples) % 2 else 60, n)
        samples.append((ids.tolist(), (rng.random(n) < 0.6).astype(int).tolist()))
    want = Counter()
    for ids, mask in samples:
        sel = np.asarray(ids)[np.asarray(mask, dtype=bool)]
        for t, c in zip(*np.unique(sel, return_counts=True)):
            want[int(t)] += int(c)
    assert ordered_counts(samples, chunk=chunk) == [[t, c] for t, c in want.items()]


def test_the_publisher_sees_an_epoch_only_once_the_plan_is_written(
    tmp_path, specforge, monkeypatch
):
    """A restarted capture has committed samples the publisher thread takes at once; their refs
    need the plan (the trainer's bytes of a sample): the epoch's order is handed to the
    publisher only after the plan is written (a trial with two trainer ranks lost the race:
    TypeError in the publisher, the capture failed)."""
    from hsdump.online.producer import Producer, run

    seen = []
    write = Producer._write_plan

    def checked(self, *args):
        seen.append(dict(self.order))  # what the publisher could see while the plan is written
        return write(self, *args)

    monkeypatch.setattr(Producer, "_write_plan", checked)
    folder = tmp_path / "f"
    c = Consumer(folder)
    c.start()
    run(producer_cfg(folder))
    c.join(60)
    assert c.error is None and seen == [{}]
