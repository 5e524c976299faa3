"""Captured rows in transit, from SGLang's scheduler process to the caller (no sglang import).

Scheduler side: `pack_rows` runs on the device inside the forward and lays a batch's rows
out slot-major with their NaN/Inf flags; `unpack_rows` reads that buffer back on the host;
`Sender` pushes each request's slice as raw frames over ZMQ. Caller side: `Receiver` pulls the
frames, stitches a request's chunks by start position and hands over one contiguous [n, H]
tensor per slot. A slot is one captured layer or final state.

Transports. One node: an `ipc://` endpoint in a private temp folder of the caller's node,
unauthenticated (the folder is the caller's), unbounded sends (ZMQ's defaults). One engine
over several nodes: the scheduler that owns rows may run on another node, so the receiver
binds `tcp://` and every connection must pass ZMQ CURVE authentication: the run's keys
(`new_run_keys`, fresh for every run, never a fixed secret) hold the receiver's keypair and
one client keypair; the ZAP handler lets in only that client public key, so a client without
keys, with another run's keys or with forged ones never gets a frame through. Over TCP the
sender's queue is bounded (`SNDHWM`), it queues only on a completed (authenticated)
connection (`IMMEDIATE`), its sends time out (`SNDTIMEO`) and raise `DeliveryError`, and
every message carries a per-sender sequence number, so a message lost on a broken
connection fails the run at the receiver, naming the sender, instead of being missed.
The senders' half of the keys (`Receiver.sender_spec`, with the client secret) must reach
the schedulers only over the channel that starts the run: the scheduler spec's env var on
the caller's node, a 0600 file of the run's (hsdump.capture.nodes.write_run_keys) for the others.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

import torch

from hsdump.store.layout import ROW_DTYPES, torch_dtype

log = logging.getLogger(__name__)


class CaptureError(RuntimeError):
    """The engine did not deliver what a sample needs; the message says what went wrong."""


class DeliveryError(CaptureError):
    """A scheduler could not hand its rows to the receiver within the bound (receiver gone,
    unreachable, refusing this sender's keys, or not taking rows). Raised on the sending side:
    the rows are not delivered, so the run must fail."""


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
        raise ValueError(
            f"captured widths {[p.shape[-1] for p in parts]} are not multiples of "
            f"the hidden size {hidden}"
        )
    views = [p[:t].reshape(t, p.shape[-1] // hidden, hidden) for p in parts]
    s = sum(v.shape[1] for v in views)
    buf = torch.empty(t * (s * hidden + s), dtype=dtype, device=parts[0].device)
    rows = buf[: s * t * hidden].view(s, t, hidden)
    j = 0
    for v in views:
        rows[j : j + v.shape[1]].copy_(v.transpose(0, 1))
        j += v.shape[1]
    finite = torch.isfinite(rows.amax(dim=2)) & torch.isfinite(rows.amin(dim=2))
    buf[s * t * hidden :].view(s, t).copy_(finite)
    return buf.view(t, s * hidden + s)


def unpack_rows(buf: torch.Tensor, s: int, hidden: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """pack_rows' buffer (on the host) -> rows [S, T, H] and its raw flags [S, T] (1 or 0)."""
    t = buf.shape[0]
    flat = buf.reshape(-1)
    return flat[: s * t * hidden].view(s, t, hidden), flat[s * t * hidden :].view(s, t)


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
SEND_TIMEOUT_S = 60.0  # TCP: longest wait for room in the queue / an authenticated connection
SEND_HWM = 8  # TCP: messages (request chunks, up to a few 100 MB each) queued per sender
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = 5_000, 30_000  # TCP: a silent peer is dropped
ZAP_DOMAIN = "hsdump-rows"
SPEC_KEYS = ("endpoint", "server_key", "client_public", "client_secret")


def _is_tcp(endpoint: str) -> bool:
    return endpoint.startswith("tcp://")


def _need_curve() -> None:
    import zmq

    if not zmq.has("curve"):
        raise RuntimeError(
            f"this pyzmq/libzmq ({zmq.zmq_version()}) was built without CURVE "
            "security: rows cannot travel between nodes authenticated"
        )


def new_run_keys() -> Dict[str, str]:
    """Fresh CURVE keys for one run (Z85 text): the receiver's keypair and the one client
    keypair its schedulers use. Never reuse them across runs; keep `server_secret` on the
    receiver's node (it never goes into a sender spec)."""
    import zmq

    _need_curve()
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    return {
        "server_public": server_public.decode(),
        "server_secret": server_secret.decode(),
        "client_public": client_public.decode(),
        "client_secret": client_secret.decode(),
    }


def _check_spec(spec: dict) -> None:
    if not isinstance(spec, dict) or not isinstance(spec.get("endpoint"), str):
        raise ValueError(f"a row transport spec is a dict with an 'endpoint', not {spec!r:.80}")
    if _is_tcp(spec["endpoint"]):
        missing = [k for k in SPEC_KEYS if not spec.get(k)]
        if missing:
            raise ValueError(
                f"the row transport spec for {spec['endpoint']} lacks "
                f"{', '.join(missing)}: rows never travel over TCP unauthenticated"
            )
        for k in SPEC_KEYS[1:]:
            if len(str(spec[k])) != 40:
                raise ValueError(
                    f"the row transport spec's {k} is not a Z85 CURVE key (40 characters)"
                )


class Sender:
    """Per scheduler process: a PUSH socket carrying (header, one frame per slot) messages.
    `source` names the process (its parallel ranks) in every header, so the receiver can
    check that each request's rows come from one process only.

    `Sender(endpoint, source)` is the one-node ipc sender, unchanged. For another node, build
    it from the spec the receiver gave out: `Sender.from_spec(rx.sender_spec(), source)`
    (CURVE client keys, bounded queue, sends that raise `DeliveryError` after
    `send_timeout` seconds instead of blocking or queuing for a receiver that is gone)."""

    def __init__(
        self,
        endpoint: str,
        source: str = "?",
        curve: Optional[dict] = None,
        send_timeout: Optional[float] = None,
        hwm: Optional[int] = None,
    ):
        """curve: {"server_key", "client_public", "client_secret"} (Z85), required for tcp://.
        send_timeout / hwm: default SEND_TIMEOUT_S / SEND_HWM over TCP, ZMQ's defaults
        (block, 1000 messages) over ipc unless given."""
        import zmq

        self._zmq = zmq
        self.source = source
        self.endpoint = endpoint
        tcp = _is_tcp(endpoint)
        if tcp or curve is not None:  # CURVE over ipc works too; TCP never goes without it
            _check_spec({**(curve or {}), "endpoint": "tcp://" + endpoint.split("://")[-1]})
        if tcp:
            send_timeout = SEND_TIMEOUT_S if send_timeout is None else send_timeout
            hwm = SEND_HWM if hwm is None else hwm
        self.send_timeout = send_timeout
        self.sock = zmq.Context.instance().socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 10_000)
        self._mon = None
        self._seen: set = set()  # connection events seen, for the DeliveryError message
        self._seq = 0
        self._sid: Optional[str] = None
        self._host: Optional[str] = None
        if curve is not None:
            _need_curve()
            self.sock.curve_serverkey = curve["server_key"].encode()
            self.sock.curve_publickey = curve["client_public"].encode()
            self.sock.curve_secretkey = curve["client_secret"].encode()
        if tcp:
            # sequence numbers let the receiver see a message lost on a broken connection
            self._sid = uuid.uuid4().hex[:12]
            self._host = socket.gethostname()
            self.sock.setsockopt(zmq.IMMEDIATE, 1)  # queue only on an authenticated link
            self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
            self.sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
            if "[" in endpoint:
                self.sock.setsockopt(zmq.IPV6, 1)
            self._mon = self.sock.get_monitor_socket(
                zmq.EVENT_CONNECTED
                | zmq.EVENT_DISCONNECTED
                | zmq.EVENT_HANDSHAKE_SUCCEEDED
                | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            )
        if send_timeout is not None:
            self.sock.setsockopt(zmq.SNDTIMEO, max(1, int(send_timeout * 1000)))
        if hwm is not None:
            self.sock.setsockopt(zmq.SNDHWM, int(hwm))
        self.sock.connect(endpoint)

    @classmethod
    def from_spec(
        cls,
        spec: dict,
        source: str = "?",
        send_timeout: Optional[float] = None,
        hwm: Optional[int] = None,
    ) -> "Sender":
        """The sender for a transport spec ({"endpoint"} for ipc; {"endpoint", "server_key",
        "client_public", "client_secret"} for tcp, as `Receiver.sender_spec` or
        `hsdump.capture.nodes.read_run_keys` give it)."""
        _check_spec(spec)
        curve = {k: spec[k] for k in SPEC_KEYS[1:]} if spec.get("server_key") else None
        return cls(spec["endpoint"], source, curve=curve, send_timeout=send_timeout, hwm=hwm)

    def _who(self) -> str:
        return f"{self.source} on {self._host}" if self._host else self.source

    def _why(self) -> str:
        """What the connection's events say about a send that could not complete."""
        zmq = self._zmq
        if self._mon is not None:
            from zmq.utils.monitor import recv_monitor_message

            while True:
                try:
                    self._seen.add(recv_monitor_message(self._mon, zmq.NOBLOCK)["event"])
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    break
        seen = self._seen
        if zmq.EVENT_HANDSHAKE_FAILED_AUTH in seen:
            return (
                "the receiver refused this sender's CURVE key: the keys are not this run's "
                "(a stale key file, or another run's spec)"
            )
        if seen & {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}:
            return (
                "the CURVE handshake failed: wrong server key (another run's?), or the "
                "endpoint is not this run's hsdump receiver"
            )
        if zmq.EVENT_HANDSHAKE_SUCCEEDED in seen and zmq.EVENT_DISCONNECTED in seen:
            return "the receiver went away (its process ended, or the link between the nodes broke)"
        if zmq.EVENT_HANDSHAKE_SUCCEEDED in seen:
            return "the receiver is connected but took no rows (stalled or frozen)"
        if self._mon is not None:
            return (
                "no connection could be made (receiver not running, wrong address, or a "
                "firewall between the nodes)"
            )
        return "the receiver is gone or not taking rows"

    def _send(self, parts: list, what: str) -> None:
        try:
            self.sock.send_multipart(parts, copy=False)
        except self._zmq.Again:
            raise DeliveryError(
                f"{self._who()}: {what} could not be delivered to {self.endpoint} within "
                f"{self.send_timeout:g} s: {self._why()}"
            ) from None

    def _header(self, h: dict) -> bytes:
        if self._sid is not None:
            h.update(sid=self._sid, seq=self._seq, host=self._host)
        self._seq += 1
        return json.dumps(h).encode()

    def rows(self, rid: str, start: int, slots: torch.Tensor, nonfinite: List[int]) -> None:
        # slots: [S, n, H] on the CPU, each slots[s] contiguous: one frame per slot
        header = {
            "rid": rid,
            "start": int(start),
            "n": int(slots.shape[1]),
            "hidden": int(slots.shape[2]),
            "dtype": str(slots.dtype).split(".")[-1],
            "nonfinite": nonfinite,
            "src": self.source,
        }
        frames = [x.view(torch.uint8).numpy() if x.numel() else b"" for x in slots.unbind(0)]
        self._send(
            [self._header(header)] + frames,
            f"rows {int(start)}..{int(start) + int(slots.shape[1])} of request {rid}",
        )

    def heartbeat(self, node: int) -> None:
        """A node's sign of life (another node's hsdump process, not a scheduler): the
        receiver notes when each node last sent one (Receiver.heartbeats)."""
        self._send(
            [self._header({"heartbeat": int(node), "src": self.source}), b""],
            f"node {node}'s heartbeat",
        )

    def error(self, message: str) -> None:
        h = {"error": message}
        if self._sid is not None:  # over TCP the receiver names the sender in the error
            h["src"] = self.source
        self._send([self._header(h), b""], f"the error report ({message})")

    def close(self, linger_s: float = 10.0) -> None:
        """Flush what is queued (up to `linger_s`) and close."""
        if self._mon is not None:
            self.sock.disable_monitor()
            self._mon.close(linger=0)
            self._mon = None
        self.sock.close(linger=int(linger_s * 1000))


def frame_tensor(h: dict, body) -> torch.Tensor:
    """One received frame as an [n, H] tensor over the frame's memory (no copy)."""
    if h["dtype"] not in ROW_DTYPES:
        raise KeyError(f"rows in dtype {h['dtype']!r}")
    dtype = torch_dtype(h["dtype"])
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
    arrive for a request already handed over are errors, never silently merged.

    `Receiver("ipc://...")`: the one-node receiver. `Receiver("tcp://IP:PORT", keys=
    new_run_keys())`: the receiver of an engine spread over nodes, CURVE-authenticated (a
    tcp endpoint without keys is refused); port 0 picks a free port; `endpoint` is the bound
    one, `sender_spec()` what the senders need."""

    CLOSED_KEEP = 1 << 16  # recently completed request ids remembered to catch late repeats

    def __init__(self, endpoint: str, keys: Optional[Dict[str, str]] = None):
        super().__init__(name="hsdump-rows", daemon=True)
        import zmq

        self._zmq = zmq
        self._keys = keys
        self._auth = None
        self.refused = 0  # connections refused for an unknown CURVE client key
        if _is_tcp(endpoint) and keys is None:
            raise ValueError(
                f"a row receiver on {endpoint} needs the run's CURVE keys "
                "(rows.new_run_keys()): rows never travel over TCP unauthenticated"
            )
        if keys is None:
            self._ctx = zmq.Context.instance()
            self.sock = self._ctx.socket(zmq.PULL)
            self.sock.bind(endpoint)
            self.endpoint = endpoint
        else:
            self._bind_curve(endpoint, keys)
        self.cond = threading.Condition()
        # rid -> [(start, one [n, H] tensor per slot, nonfinite slots, source)]
        self.parts: Dict[str, List[Tuple[int, List[torch.Tensor], List[int], str]]] = {}
        self.error: Optional[str] = None
        # rows received per sending process: {source: {"messages": m, "rows": r}}
        self.sources: Dict[str, Dict[str, int]] = {}
        # rid -> the source that completed it, or None if the caller discarded it
        self._closed: "OrderedDict[str, Optional[str]]" = OrderedDict()
        # TCP senders' next sequence numbers, by sender id: a gap is a lost message
        self._next_seq: Dict[str, int] = {}
        # node rank -> (time.monotonic() of its last heartbeat, its host)
        self.heartbeats: Dict[int, Tuple[float, str]] = {}
        self._stop_evt = threading.Event()

    def _bind_curve(self, endpoint: str, keys: Dict[str, str]) -> None:
        zmq = self._zmq
        from zmq.auth.thread import ThreadAuthenticator

        _need_curve()
        missing = [
            k for k in ("server_public", "server_secret", "client_public") if not keys.get(k)
        ]
        if missing:
            raise ValueError(f"the run keys lack {', '.join(missing)} (rows.new_run_keys())")
        allowed = {keys["client_public"].encode()}
        rx, seen = self, set()

        class _Allowed:
            def callback(self, domain, key):
                if key in allowed:
                    return True
                rx.refused += 1
                if key not in seen:  # once per key: a refused client may keep retrying
                    seen.add(key)
                    log.warning(
                        "refused a row sender with an unknown CURVE key %s... (not "
                        "this run's keys): it delivers nothing",
                        key[:8].decode(),
                    )
                return False

        # a context of its own: a ZAP handler serves one context, and this one only this socket
        self._ctx = zmq.Context()
        self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger(__name__ + ".zap"))
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=_Allowed())
        self.sock = self._ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.curve_server = True
        self.sock.curve_publickey = keys["server_public"].encode()
        self.sock.curve_secretkey = keys["server_secret"].encode()
        self.sock.zap_domain = ZAP_DOMAIN.encode()
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self.sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        if "[" in endpoint:
            self.sock.setsockopt(zmq.IPV6, 1)
        try:
            self.sock.bind(endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise OSError(f"the row receiver cannot bind {endpoint}: {e}") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def sender_spec(self, host: Optional[str] = None) -> Dict[str, str]:
        """What a scheduler needs to send here (`Sender.from_spec`), JSON-serialisable:
        {"endpoint"} over ipc; over TCP also "server_key" (the receiver's public key),
        "client_public" and "client_secret" (this run's client keypair: the spec is a secret,
        it travels only over the channel that starts the run). `host` replaces the bound
        address in the endpoint (needed when bound to 0.0.0.0)."""
        endpoint = self.endpoint
        if host is not None or "://0.0.0.0:" in endpoint or "://[::]:" in endpoint:
            if host is None:
                raise ValueError(
                    f"the receiver is bound to {endpoint}: name the address the "
                    "senders should connect to (host=)"
                )
            port = endpoint.rsplit(":", 1)[1]
            endpoint = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        if self._keys is None:
            return {"endpoint": endpoint}
        return {
            "endpoint": endpoint,
            "server_key": self._keys["server_public"],
            "client_public": self._keys["client_public"],
            "client_secret": self._keys["client_secret"],
        }

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
            try:
                h = json.loads(head.bytes)
                if not isinstance(h, dict):
                    raise ValueError("the header is not an object")
            except ValueError as e:
                with self.cond:
                    self.error = self.error or f"a row message with an unreadable header: {e}"
                    self.cond.notify_all()
                continue
            with self.cond:
                self._check_sequence(h)
                if "error" in h:
                    self.error = f"{_who(h)}: {h['error']}" if "src" in h else h["error"]
                elif "heartbeat" in h:
                    self.heartbeats[int(h["heartbeat"])] = (
                        time.monotonic(),
                        str(h.get("host", "?")),
                    )
                else:
                    self._add(h, frames)
                self.cond.notify_all()
            # the frames live on only in their tensors: held here until the next message, the
            # last one's memory (up to a chunk of rows, 0.4 GB at 16K x 8B) outlived its sample
            head = frames = None

    def _check_sequence(self, h: dict) -> None:
        """TCP senders number their messages: a gap means messages were lost in transit
        (a connection broke with messages in flight), which fails the run."""
        sid = h.get("sid")
        if sid is None:
            return
        want = self._next_seq.get(sid, 0)
        self._next_seq[sid] = h["seq"] + 1
        if h["seq"] != want:
            self.error = self.error or (
                f"{_who(h)}: {h['seq'] - want} row message(s) from this sender were lost in "
                f"transit (message {h['seq']} arrived where {want} was expected): the link "
                "between the nodes broke with rows in flight"
            )

    def _add(self, h: dict, frames) -> None:
        rid, src = h["rid"], h.get("src", "?")
        stat = self.sources.setdefault(src, {"messages": 0, "rows": 0})
        stat["messages"] += 1
        stat["rows"] += h["n"]
        if rid in self._closed:
            first = self._closed[rid]
            if first is None:  # the caller gave this request up: late rows are dropped
                return
            who = (
                "were sent twice by it"
                if src == first
                else f"were first sent by {first}: two scheduler processes sent the same request, "
                "a parallel layout hsdump's capture does not handle"
            )
            self.error = self.error or (
                f"request {rid}: rows {h['start']}..{h['start'] + h['n']} arrived from {_who(h)} "
                f"after the sample was complete; they {who}"
            )
            return
        self.parts.setdefault(rid, []).append(
            (h["start"], [frame_tensor(h, f) for f in frames], h["nonfinite"], src)
        )

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
            raise CaptureError(
                f"request {rid}: {sum(p[1][0].shape[0] for p in parts)} of {n} "
                f"captured rows arrived within {timeout:.0f} s"
            )
        if len(srcs) > 1:
            raise CaptureError(
                f"request {rid}: rows came from {len(srcs)} scheduler processes "
                f"({', '.join(srcs)}); each request must be sent once, by the "
                "attention-TP rank 0 of the group that ran it"
            )
        pos = 0
        for start, t, _, _ in parts:
            if start != pos:
                raise CaptureError(
                    f"request {rid}: rows from {start} arrived where {pos} was "
                    "expected; chunks were lost or repeated"
                )
            pos += t[0].shape[0]
        if pos != n:
            raise CaptureError(
                f"request {rid}: {pos} captured rows arrived for a sample of {n} "
                "tokens; chunks were repeated"
            )
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
                log.info(
                    "captured rows came from %d scheduler process(es): %s",
                    len(self.sources),
                    ", ".join(f"{k} {v['rows']} rows" for k, v in sorted(self.sources.items())),
                )
        self._stop_evt.set()
        if self.is_alive():
            self.join(timeout=5)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self.sock.close(linger=0)
        if self._auth is not None:  # the TCP receiver's own context and ZAP handler
            self._auth.stop()
            self._auth = None
            self._ctx.term()


def _who(h: dict) -> str:
    """The sending process named in a header, with its host when it came over TCP."""
    src = h.get("src", "?")
    return f"{src} on {h['host']}" if h.get("host") else src
