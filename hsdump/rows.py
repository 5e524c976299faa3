"""Captured rows in transit, from SGLang's scheduler process to the caller (no sglang import).

Scheduler side: `pack_rows` runs on the device inside the forward and lays a batch's rows
out slot-major with their NaN/Inf flags; `unpack_rows` reads that buffer back on the host;
`Sender` pushes each request's slice as raw frames over ZMQ. Caller side: `Receiver` pulls the
frames, stitches a request's chunks by start position and hands over one contiguous [n, H]
tensor per slot. A slot is one captured layer or final state.
"""

from __future__ import annotations

import json
import logging
import threading
import warnings
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

import torch

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class CaptureError(RuntimeError):
    """The engine did not deliver what a sample needs; the message says what went wrong."""


# --------------------------------------------------------------------------- buffer layout
def pack_rows(parts: List[torch.Tensor], t: int, hidden: int) -> torch.Tensor:
    """On the device, inside the forward: the first `t` captured rows (aux [T', K * H] or K
    [T', H], then the final states [T', H]; T' >= t) -> one buffer of shape [t, S * H + S]
    whose memory holds [S, t, H] (slot-major: each request's rows of one slot are one
    contiguous block on the host) followed by [S, t] finite flags (1 = the row has no NaN/Inf;
    amax propagates NaN, +Inf shows in amax and -Inf in amin). SGLang then copies it to the
    host in one non-blocking transfer, so the scheduler's CPU does no per-row work.

    `t` must be the batch's real token count: a prefill CUDA graph pads the forward to a
    bucket and SGLang then keeps `[:real]` rows of the buffer, which on a slot-major buffer
    padded to T' would cut through the slots (see `flags_valid`).

    `t == 0` (a data-parallel-attention rank with no request in this step runs an idle forward
    of 0 tokens) gives an empty [0, S * H + S] buffer; the capture hook passes idle forwards
    through before it gets here, so this only keeps the layout total."""
    dtype = parts[0].dtype
    if any(p.shape[-1] % hidden for p in parts):
        raise ValueError(f"captured widths {[p.shape[-1] for p in parts]} are not multiples of "
                         f"the hidden size {hidden}")
    views = [p[:t].reshape(t, p.shape[-1] // hidden, hidden) for p in parts]
    s = sum(v.shape[1] for v in views)
    buf = torch.empty(t * (s * hidden + s), dtype=dtype, device=parts[0].device)
    rows = buf[: s * t * hidden].view(s, t, hidden)
    j = 0
    for v in views:
        rows[j: j + v.shape[1]].copy_(v.transpose(0, 1))
        j += v.shape[1]
    finite = torch.isfinite(rows.amax(dim=2)) & torch.isfinite(rows.amin(dim=2))
    buf[s * t * hidden:].view(s, t).copy_(finite)
    return buf.view(t, s * hidden + s)


def unpack_rows(buf: torch.Tensor, s: int, hidden: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """pack_rows' buffer (on the host) -> rows [S, T, H] and its raw flags [S, T] (1 or 0)."""
    t = buf.shape[0]
    flat = buf.reshape(-1)
    return flat[: s * t * hidden].view(s, t, hidden), flat[s * t * hidden:].view(s, t)


def flags_valid(flags: torch.Tensor) -> bool:
    """pack_rows writes only 1 and 0 as flags. Anything else there means the buffer reached
    the host with another row count than it was packed for (rows cut or padded after the
    pack), so its slots are misaligned: the rows must not be used. Costs S * T compares."""
    return bool(((flags == 1) | (flags == 0)).all())


def bad_slots(flags: torch.Tensor) -> List[int]:
    """The slots of a request's [S, n] flags (1 = finite) that hold a non-finite row."""
    finite = flags != 0
    return [] if bool(finite.all()) else (~finite.all(dim=1)).nonzero().flatten().tolist()


# --------------------------------------------------------------------------- transport
class Sender:
    """Per scheduler process: a PUSH socket carrying (header, one frame per slot) messages.
    `source` names the process (its parallel ranks) in every header, so the receiver can
    check that each request's rows come from one process only."""

    def __init__(self, endpoint: str, source: str = "?"):
        import zmq

        self.source = source
        self.sock = zmq.Context.instance().socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 10_000)
        self.sock.connect(endpoint)

    def rows(self, rid: str, start: int, slots: torch.Tensor, nonfinite: List[int]) -> None:
        # slots: [S, n, H] on the CPU, each slots[s] contiguous: one frame per slot
        header = {"rid": rid, "start": int(start), "n": int(slots.shape[1]),
                  "hidden": int(slots.shape[2]), "dtype": str(slots.dtype).split(".")[-1],
                  "nonfinite": nonfinite, "src": self.source}
        frames = [x.view(torch.uint8).numpy() if x.numel() else b"" for x in slots.unbind(0)]
        self.sock.send_multipart([json.dumps(header).encode()] + frames, copy=False)

    def error(self, message: str) -> None:
        self.sock.send_multipart([json.dumps({"error": message}).encode(), b""])


def frame_tensor(h: dict, body) -> torch.Tensor:
    """One received frame as an [n, H] tensor over the frame's memory (no copy)."""
    dtype = DTYPES[h["dtype"]]
    if h["n"] == 0:
        return torch.empty((0, h["hidden"]), dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zmq frames are read-only; hsdump never writes them
        flat = torch.frombuffer(body.buffer, dtype=torch.uint8)
    return flat.view(dtype).view(h["n"], h["hidden"])


class Receiver(threading.Thread):
    """Pulls row messages and stitches them per request id.

    Any number of scheduler processes may send (one per data-parallel group under DP
    attention, one per replica with dp_size). Every request must be sent by exactly one of
    them, once: chunks of one request from two processes, rows that overlap, or rows that
    arrive for a request already handed over are errors, never silently merged."""

    CLOSED_KEEP = 1 << 16  # recently completed request ids remembered to catch late repeats

    def __init__(self, endpoint: str):
        super().__init__(name="hsdump-rows", daemon=True)
        import zmq

        self._zmq = zmq
        self.sock = zmq.Context.instance().socket(zmq.PULL)
        self.sock.bind(endpoint)
        self.cond = threading.Condition()
        # rid -> [(start, one [n, H] tensor per slot, nonfinite slots, source)]
        self.parts: Dict[str, List[Tuple[int, List[torch.Tensor], List[int], str]]] = {}
        self.error: Optional[str] = None
        # rows received per sending process: {source: {"messages": m, "rows": r}}
        self.sources: Dict[str, Dict[str, int]] = {}
        # rid -> the source that completed it, or None if the caller discarded it
        self._closed: "OrderedDict[str, Optional[str]]" = OrderedDict()
        self._stop_evt = threading.Event()

    def _close(self, rid: str, source: Optional[str]) -> None:
        self._closed[rid] = source
        while len(self._closed) > self.CLOSED_KEEP:
            self._closed.popitem(last=False)

    def run(self) -> None:
        poller = self._zmq.Poller()
        poller.register(self.sock, self._zmq.POLLIN)
        while not self._stop_evt.is_set():
            if not poller.poll(100):
                continue
            head, *frames = self.sock.recv_multipart(copy=False)
            h = json.loads(head.bytes)
            with self.cond:
                if "error" in h:
                    self.error = h["error"]
                else:
                    self._add(h, frames)
                self.cond.notify_all()
            # the frames live on only in their tensors: held here until the next message, the
            # last one's memory (up to a chunk of rows, 0.4 GB at 16K x 8B) outlived its sample
            head = frames = None

    def _add(self, h: dict, frames) -> None:
        rid, src = h["rid"], h.get("src", "?")
        stat = self.sources.setdefault(src, {"messages": 0, "rows": 0})
        stat["messages"] += 1
        stat["rows"] += h["n"]
        if rid in self._closed:
            first = self._closed[rid]
            if first is None:  # the caller gave this request up: late rows are dropped
                return
            who = ("were sent twice by it" if src == first else
                   f"were first sent by {first}: two scheduler processes sent the same request, "
                   "a parallel layout hsdump's capture does not handle")
            self.error = self.error or (
                f"request {rid}: rows {h['start']}..{h['start'] + h['n']} arrived from {src} "
                f"after the sample was complete; they {who}")
            return
        self.parts.setdefault(rid, []).append(
            (h["start"], [frame_tensor(h, f) for f in frames], h["nonfinite"], src))

    def take(self, rid: str, n: int, timeout: float) -> Tuple[List[torch.Tensor], List[int]]:
        """Rows 0..n-1 of request `rid`: one contiguous [n, H] tensor per slot, and the slots
        that hold NaN/Inf in any chunk."""
        def have() -> int:
            return sum(p[1][0].shape[0] for p in self.parts.get(rid, []))

        with self.cond:
            ok = self.cond.wait_for(lambda: self.error is not None or have() >= n, timeout)
            if self.error is not None:
                raise CaptureError(self.error)
            parts = sorted(self.parts.pop(rid, []), key=lambda p: p[0])
            srcs = sorted({p[3] for p in parts})
            self._close(rid, srcs[0] if ok and len(srcs) == 1 else None)
        if not ok:
            raise CaptureError(f"request {rid}: {sum(p[1][0].shape[0] for p in parts)} of {n} "
                               f"captured rows arrived within {timeout:.0f} s")
        if len(srcs) > 1:
            raise CaptureError(f"request {rid}: rows came from {len(srcs)} scheduler processes "
                               f"({', '.join(srcs)}); each request must be sent once, by the "
                               "attention-TP rank 0 of the group that ran it")
        pos = 0
        for start, t, _, _ in parts:
            if start != pos:
                raise CaptureError(f"request {rid}: rows from {start} arrived where {pos} was "
                                   "expected; chunks were lost or repeated")
            pos += t[0].shape[0]
        if pos != n:
            raise CaptureError(f"request {rid}: {pos} captured rows arrived for a sample of {n} "
                               "tokens; chunks were repeated")
        bad = sorted({s for p in parts for s in p[2]})
        if len(parts) == 1:
            return parts[0][1], bad
        # chunked prefill: one concatenation per slot (the only copy on the caller's side);
        # each slot's chunks are let go once stitched, so the chunks and the whole copy never
        # coexist (measured: 0.54 GB less at the peak of a 32K sample, bench/mem_bench.py)
        out = []
        for s in range(len(parts[0][1])):
            out.append(torch.cat([p[1][s] for p in parts]))
            for p in parts:
                p[1][s] = None
        return out, bad

    def discard(self, rid: str) -> None:
        with self.cond:
            self.parts.pop(rid, None)
            if self._closed.get(rid) is None:  # rows still on their way are dropped
                self._close(rid, None)

    def stop(self) -> None:
        with self.cond:
            self.error = self.error or "the row receiver was stopped"
            self.cond.notify_all()
            if self.sources:
                log.info("captured rows came from %d scheduler process(es): %s",
                         len(self.sources), ", ".join(f"{k} {v['rows']} rows" for k, v in
                                                      sorted(self.sources.items())))
        self._stop_evt.set()
        self.join(timeout=5)
        self.sock.close(linger=0)
