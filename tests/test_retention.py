"""The caller lets go of captured rows as soon as they are handed on.

On the GPU (8B shape, 32K-token samples in two 16K chunks) the caller's RSS grew 2.22 GB
more than the rows the receiver and the writer held (docs/performance.md, "Host memory").
`bench/mem_bench.py --caller-only` itemised it on the CPU: the previous sample kept alive by
the run loop after the writer had it (0.81 GB), the last message's frames kept by the
receiver thread (up to 0.40 GB), and every chunk kept while the whole sample was stitched
(0.54 GB). These tests hold each of those to "released" with weak references, through the
real Sender/Receiver over ZMQ and the real `CaptureEngine._drive` loop (its SGLang request,
`_one`, replaced: what is under test is hsdump's loop, not SGLang)."""

import asyncio
import threading
import weakref
from types import SimpleNamespace

import torch

from hsdump.capture import rows
from hsdump.capture.base import CapturedSample, Request
from hsdump.capture.engine import CaptureEngine
from hsdump.capture.rows import Receiver, Sender


def test_drive_drops_a_sample_once_the_sink_has_it():
    eng = object.__new__(CaptureEngine)
    eng.cfg = SimpleNamespace(inflight_tokens=4)  # one sample in flight at a time
    eng._died, eng._aborted, eng._stop_requested, eng._wake = None, False, False, None
    refs, alive_later, sunk = {}, [], []

    async def one(req):
        sid = req.sid
        await asyncio.sleep(0.02)  # _drive waits for this task meanwhile
        if sid > 0:  # the sink took sample sid - 1 and kept nothing of it
            alive_later.append(refs[sid - 1]() is not None)
        t = torch.zeros(8, 16)
        refs[sid] = weakref.ref(t)
        return CapturedSample(sid, req.input_ids, None, [t])

    eng._one = one
    samples = iter([Request(i, [1, 2, 3]) for i in range(4)])
    assert asyncio.run(eng._drive(samples, lambda s: sunk.append(s.sid)))
    assert sunk == [0, 1, 2, 3]
    assert alive_later == [False, False, False]


def test_receiver_lets_chunks_and_frames_go(tmp_path, monkeypatch):
    rx = Receiver(f"ipc://{tmp_path}/rows")
    rx.start()
    frames, chunks = [], []  # weak references, in arrival order (message, then slot)
    real_frame_tensor, real_cat = rows.frame_tensor, torch.cat

    def frame_tensor(h, body):
        t = real_frame_tensor(h, body)
        frames.append(weakref.ref(body))
        chunks.append(weakref.ref(t))
        return t

    slots, n, hidden = 3, 5, 8
    alive_at_cat = []

    def cat(ts, *a, **k):
        if threading.current_thread() is threading.main_thread() and len(ts) == 2:
            s = len(alive_at_cat)  # slot s: slots 0..s-1 were stitched already
            alive_at_cat.append(
                [chunks[m * slots + j]() is not None for m in range(2) for j in range(s)]
            )
        return real_cat(ts, *a, **k)

    monkeypatch.setattr(rows, "frame_tensor", frame_tensor)
    monkeypatch.setattr(torch, "cat", cat)
    tx = Sender(f"ipc://{tmp_path}/rows", source="dp0-tp0-test")
    data = torch.arange(slots * 2 * n * hidden, dtype=torch.float32).to(torch.bfloat16)
    data = data.view(slots, 2 * n, hidden)
    try:
        tx.rows("r1", 0, data[:, :n].contiguous(), [])
        tx.rows("r1", n, data[:, n:].contiguous(), [])
        out, bad = rx.take("r1", 2 * n, timeout=30)
        assert bad == [] and all(torch.equal(out[s], data[s]) for s in range(slots))
        # each slot's chunks were let go before the next slot was stitched
        assert alive_at_cat == [[], [False, False], [False] * 4]
        del out
        # nothing keeps the frames either, the last message's included
        for _ in range(50):
            if all(r() is None for r in frames):
                break
            threading.Event().wait(0.02)
        assert len(frames) == 2 * slots and all(r() is None for r in frames)
    finally:
        rx.stop()
        tx.sock.close(linger=0)
