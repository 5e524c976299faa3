"""mem_bench.py --caller-only: the caller's host memory at 2K and 32K itemised with no SGLang
engine (a child process stands in for the scheduler), variant by variant; and the Tracker that
places each byte of captured rows in the stage holding it (mem_bench.py's GPU run uses it too)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

import psutil
import torch

MEM_BENCH = str(Path(__file__).resolve().with_name("mem_bench.py"))  # --caller-run's process


# --------------------------------------------------------------------------- --caller-only
# The caller's share at 32K, itemised on any machine (no SGLang, no GPU): a child process
# stands in for the scheduler and runs hsdump's own scheduler-side code (rows.pack_rows on the
# CPU, patch._emit_rows -> rows.Sender) on 16,384-token chunked-prefill batches; the caller
# runs the real CaptureEngine.run (its _drive/_one over a stand-in sglang.Engine whose
# async_generate returns once the child has sent a request's last chunk), the real
# rows.Receiver and a real DatasetWriter (the defaults: 6 threads x 256 MiB). Every `period`
# s a sampler reads this process's RSS (/proc/self/status: anon / file / shmem) and counters
# kept by weak references on every buffer of captured rows (see Tracker), so each byte is
# placed in the stage that holds it, not guessed.
CALLER_VARIANTS = {
    "as-is": "hsdump as it is",
    "trim": "as-is + glibc malloc_trim(0) after every sink and before each idle baseline",
    "mmap-4m": "as-is + GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304 (fixed: no dynamic "
    "raise, every allocation >= 4 MiB is its own mmap, returned on free)",
    "fix-drive": "CaptureEngine._drive drops its finished tasks (done = task = None) after "
    "the sink",
    "fix-drive-rx": "fix-drive + Receiver.run drops the last message's frames "
    "(head = frames = None) after _add",
    "fix-all": "fix-drive-rx + Receiver.take frees each slot's chunks once that slot is stitched",
}


class Tracker:
    """Every tensor of captured rows in the caller, by the stage that holds it, through weak
    references (a tensor's bytes leave the count when the tensor is freed):
      chunk    a received frame's [n, H] tensor (Receiver._add -> frame_tensor), not yet
               handed over;
      stitch   a slot's concatenation made inside Receiver.take, take not yet returned;
      in_hand  what take returned (stitched, or the chunk itself for a one-chunk sample),
               not yet passed to DatasetWriter.add;
      writer   passed to DatasetWriter.add, its shard not yet written (host_bytes counts it);
      written  its shard is written and committed: the writer has let it go and host_bytes no
               longer counts it; alive only because something else still references it.
    and every zmq.Frame received (its memory), so frames alive with no tensor over them show."""

    STATES = ("chunk", "stitch", "in_hand", "writer", "written")

    def __init__(self):
        import weakref

        self._weakref = weakref
        self.t: Dict[int, list] = {}  # id -> [weakref, bytes, state, frame-backed]
        self.f: Dict[int, list] = {}  # id -> [weakref, bytes]

    def add(self, x: torch.Tensor, state: str, frame: bool = False) -> None:
        k = id(x)
        if k in self.t and self.t[k][0]() is x:
            self.t[k][2] = state
            return
        self.t[k] = [
            self._weakref.ref(x, lambda r, k=k, t=self.t: t.get(k, [r])[0] is r and t.pop(k, None)),
            x.numel() * x.element_size(),
            state,
            frame,
        ]

    def mark(self, xs, state: str) -> None:
        for x in xs:
            if isinstance(x, torch.Tensor):
                self.add(x, state, False)

    def add_frame(self, fr) -> None:
        k = id(fr)
        self.f[k] = [
            self._weakref.ref(
                fr, lambda r, k=k, f=self.f: f.get(k, [r])[0] is r and f.pop(k, None)
            ),
            len(fr),
        ]

    def counts(self) -> Dict[str, int]:
        out = {s: 0 for s in self.STATES}
        on_frames = 0
        for ref, n, state, frame in list(self.t.values()):
            if ref() is not None:
                out[state] += n
                on_frames += n if frame else 0
        frames = sum(n for ref, n in list(self.f.values()) if ref() is not None)
        out["frames_alive"] = frames
        out["frames_no_tensor"] = frames - on_frames
        return out


def install_tracker(tr: "Tracker") -> Dict[str, int]:
    """Counters on hsdump's real code path in this process (wrappers call the originals):
    received frames and their tensors ("chunk"), rows.py's concatenations ("stitch"), what
    Receiver.take returns ("in_hand"), what the writer has written ("written"). Returns the
    live counts of calls inside take and add. Install before the engine starts."""
    from hsdump.capture import rows as rowsmod
    from hsdump.store import writer as writermod

    orig_frame_tensor = rowsmod.frame_tensor

    def frame_tensor(h, body):
        x = orig_frame_tensor(h, body)
        tr.add_frame(body)
        tr.add(x, "chunk", True)
        return x

    rowsmod.frame_tensor = frame_tensor

    class TorchInRows:  # rows.py's `torch`, with cat's outputs counted as "stitch"
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def cat(*args, **kw):
            x = torch.cat(*args, **kw)
            tr.add(x, "stitch")
            return x

    rowsmod.torch = TorchInRows()
    Receiver = rowsmod.Receiver
    orig_take = Receiver.take
    busy = {"take": 0, "add": 0}

    def take(self, rid, n, timeout):
        busy["take"] += 1
        try:
            rows, bad = orig_take(self, rid, n, timeout)
        finally:
            busy["take"] -= 1
        tr.mark(rows, "in_hand")
        return rows, bad

    Receiver.take = take
    orig_commit = writermod.DatasetWriter._commit

    def commit(self, name, tensors, *rest):
        orig_commit(self, name, tensors, *rest)
        tr.mark(tensors.values(), "written")

    writermod.DatasetWriter._commit = commit
    return busy


def _fake_scheduler(
    endpoint: str, req_q, ack_q, hidden: int, slots: int, chunk: int, forward_s: float
) -> None:
    """Child process: SGLang's scheduler as the caller sees it. Requests are prefilled FIFO in
    batches of at most `chunk` tokens (chunked prefill: a request that does not fit is split,
    its next part starts the next batch); each batch's rows are packed by rows.pack_rows (the
    device-side hook, here on the CPU) and sent per request by patch._emit_rows (the
    scheduler-side code itself, over a real rows.Sender); a request is acknowledged (its
    async_generate returns) once its last chunk is sent. `forward_s`: seconds a full
    `chunk`-token forward takes (pro rata), the GPU's pace."""
    from types import SimpleNamespace as NS

    from hsdump.capture.patch import _emit_rows
    from hsdump.capture.rows import Sender, pack_rows

    sender = Sender(endpoint, f"fake-scheduler-pid{os.getpid()}")
    aux = torch.full((chunk, slots * hidden), 0.5, dtype=torch.bfloat16)  # the model's rows
    pending: List[list] = []  # [rid, n, sent]
    stop = False
    while not stop or pending:
        while not stop:
            try:
                item = req_q.get(block=not pending)
            except Exception:  # queue.Empty
                break
            if item is None:
                stop = True
            else:
                pending.append([item[0], item[1], 0])
        if not pending:
            break
        t0 = time.time()
        reqs, starts, lens, budget = [], [], [], chunk
        for p in pending:
            if budget == 0:
                break
            k = min(p[1] - p[2], budget)
            reqs.append(NS(rid=p[0], return_hidden_states=True))
            starts.append(p[2])
            lens.append(k)
            p[2] += k
            budget -= k
        t = sum(lens)
        buf = pack_rows([aux[:t]], t, hidden)  # a fresh host buffer per forward, as hs.to("cpu")
        time.sleep(max(0.0, forward_s * t / chunk - (time.time() - t0)))
        result = NS(
            copy_done=None, logits_output=NS(hidden_states=buf), extend_input_len_per_req=lens
        )
        _emit_rows(
            sender, NS(reqs=reqs, prefix_lens=starts, extend_lens=lens), result, slots, hidden
        )
        del buf, result
        for p in [p for p in pending if p[2] == p[1]]:
            ack_q.put(p[0])
        pending = [p for p in pending if p[2] < p[1]]
    sender.sock.close(linger=10_000)
    ack_q.put(None)


def _patched(func, old: str, new: str):
    """`func` (a function of an hsdump module) recompiled from its source with `old`
    replaced by `new`, in its module's globals: the exact fix, applied without editing
    hsdump. Fails if the source no longer holds `old`."""
    import inspect
    import textwrap

    src = inspect.getsource(func)
    fix = next(
        line.strip().split("  #")[0]
        for line in new.splitlines()
        if line.strip() and line not in old.splitlines()
    )
    if fix in src:
        return func  # hsdump has this fix already (c7e2081)
    if src.count(old) != 1:
        raise RuntimeError(f"{func.__qualname__}: the text to patch is not found once")
    ns: dict = {}
    exec(
        compile(textwrap.dedent(src.replace(old, new)), f"<patched {func.__qualname__}>", "exec"),
        func.__globals__,
        ns,
    )
    return ns[func.__name__]


def _status_kb() -> Dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "RssAnon", "RssFile", "RssShmem")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


def caller_run(a) -> int:
    """One process, one variant, the lengths of --seqs in order (as the GPU run: the 32K
    baseline is taken after the 2K run, in the same process)."""
    import asyncio
    import ctypes
    import multiprocessing as mp
    from types import SimpleNamespace as NS

    from hsdump.capture import engine as engmod
    from hsdump.capture import rows as rowsmod
    from hsdump.capture.base import CaptureSpec, Request
    from hsdump.config import OutputConfig
    from hsdump.pipeline import rows_in_flight
    from hsdump.store import writer as writermod
    from hsdump.store.manifest import Manifest

    variant = a.caller_run
    hidden, slots, chunk = a.hidden, 3, a.chunk
    row_bytes = slots * hidden * 2
    libc = ctypes.CDLL("libc.so.6")
    tr = Tracker()

    Receiver = rowsmod.Receiver
    if variant in ("fix-drive-rx", "fix-all"):
        Receiver.run = _patched(
            Receiver.run,
            "                self.cond.notify_all()\n",
            "                self.cond.notify_all()\n"
            "            head = frames = None  # the frames' memory goes "
            "with their tensors\n",
        )
    if variant == "fix-all":
        Receiver.take = _patched(
            Receiver.take,
            "        return [torch.cat([p[1][s] for p in parts]) for s in "
            "range(len(parts[0][1]))], bad\n",
            "        out = []\n"
            "        for s in range(len(parts[0][1])):\n"
            "            out.append(torch.cat([p[1][s] for p in parts]))\n"
            "            for p in parts:\n"
            "                p[1][s] = None  # this slot's chunks are freed once stitched\n"
            "        return out, bad\n",
        )
    busy = install_tracker(tr)  # counters on the real code path
    drive = engmod.CaptureEngine._drive
    if variant.startswith("fix-"):
        drive = _patched(
            drive,
            "                    sink(*task.result())\n",
            "                    sink(*task.result())\n"
            "                done = task = None  # a finished task holds its "
            "sample's rows\n",
        )

    # ---- the stand-in for sglang.Engine and the scheduler process
    ctx = mp.get_context("spawn")
    req_q, ack_q = ctx.Queue(), ctx.Queue()
    ipc = tempfile.mkdtemp(prefix="hsdump-memc-")
    endpoint = f"ipc://{ipc}/rows"
    rx = Receiver(endpoint)
    rx.start()
    child = ctx.Process(
        target=_fake_scheduler,
        name="fake-scheduler",
        daemon=True,
        args=(endpoint, req_q, ack_q, hidden, slots, chunk, a.forward_s),
    )
    child.start()
    loop = asyncio.new_event_loop()
    waiting: Dict[str, asyncio.Future] = {}

    def acks():
        while True:
            rid = ack_q.get()
            if rid is None:
                return
            fut = waiting.pop(rid)
            loop.call_soon_threadsafe(fut.set_result, None)

    threading.Thread(target=acks, name="acks", daemon=True).start()

    class FakeSGLang:
        def __init__(self):
            self.loop = loop
            self.tokenizer_manager = NS()

        async def async_generate(self, input_ids, sampling_params, return_hidden_states, rid):
            waiting[rid] = loop.create_future()
            req_q.put((rid, len(input_ids)))
            await waiting[rid]
            return {"meta_info": {"finish_reason": {"type": "length", "length": 1}}}

    class Engine(engmod.CaptureEngine):
        _drive = drive

    eng = object.__new__(Engine)  # CaptureEngine's state as __init__ leaves it, minus SGLang
    spec = CaptureSpec(
        model_path="bench",
        model=NS(dtype="bfloat16"),
        engine=NS(inflight_tokens=a.inflight_tokens),
        layers=tuple(range(slots)),
        info=NS(hidden_size=hidden),
    )
    eng.__dict__.update(
        spec=spec,
        _engine=FakeSGLang(),
        _rx=rx,
        _slot=list(range(slots)),
        final=[],
        hidden=hidden,
        cfg=NS(inflight_tokens=a.inflight_tokens),
        _died=None,
        _stop_requested=False,
        _aborted=False,
        _loop=None,
        _wake=None,
    )

    # ---- the sampler
    kid = psutil.Process(child.pid)
    state = {"writer": None}
    log: List[dict] = []
    stop = threading.Event()

    def snap() -> dict:
        st = _status_kb()
        with rx.cond:
            parts = [p for ps in rx.parts.values() for p in ps]
        recv = sum(t.numel() * t.element_size() for p in parts for t in p[1] if t is not None)
        w = state["writer"]
        c = tr.counts()
        try:
            child_rss = kid.memory_info().rss
        except psutil.Error:
            child_rss = 0
        return {
            "t": time.time(),
            "rss": st["VmRSS"],
            "anon": st["RssAnon"],
            "file": st["RssFile"],
            "shmem": st["RssShmem"],
            "child_rss": child_rss,
            "receiver": recv,
            "writer": w.host_bytes if w is not None else 0,
            **c,
            "in_take": busy["take"],
            "in_add": busy["add"],
        }

    def sampler():
        while not stop.is_set():
            log.append(snap())
            time.sleep(a.period)

    out = OutputConfig(dir="x")
    seqs = [tuple(int(x) for x in item.split(":")) for item in a.seqs.split(",")]
    base = 0
    report = {
        "variant": variant,
        "about": CALLER_VARIANTS[variant],
        "env": {
            k: os.environ[k] for k in ("GLIBC_TUNABLES", "MALLOC_ARENA_MAX") if k in os.environ
        },
        "runs": {},
    }
    ids = lambda n, i: [100 + (i + j) % 30000 for j in range(n)]  # noqa: E731
    out_dir = a.out_dir or tempfile.gettempdir()
    try:
        eng.run([Request(base + i, ids(256, i)) for i in range(2)], lambda s: None)  # warm-up
        base += 2
        threading.Thread(target=sampler, name="mem-sampler", daemon=True).start()
        for seq, n in seqs:
            inflight = rows_in_flight(out, a.inflight_tokens, seq, row_bytes)
            eng.cfg = NS(inflight_tokens=inflight)
            if variant == "trim":
                libc.malloc_trim(0)
            time.sleep(0.5)
            idle = snap()
            start = len(log)
            ds = tempfile.mkdtemp(prefix="hsdump-memc-ds-", dir=out_dir)
            w = writermod.DatasetWriter(
                os.path.join(ds, "d"),
                Manifest.for_rows(
                    model="bench", hidden_size=hidden, num_hidden_layers=32, layers=[2, 16, 29]
                ),
                shard_bytes=out.shard_bytes,
                threads=out.writer_threads,
            )
            state["writer"] = w

            def sink(s):  # as the pipeline's and mem_bench's sinks
                busy["add"] += 1
                tr.mark(s.layers, "writer")
                try:
                    w.add_sample(s)
                finally:
                    busy["add"] -= 1
                if variant == "trim":
                    libc.malloc_trim(0)

            t0 = time.time()
            eng.run([Request(base + i, ids(seq, i), [1] * seq) for i in range(n)], sink)
            w.close()
            wall = time.time() - t0
            state["writer"] = None
            time.sleep(0.3)
            end = snap()
            got = log[start:]
            base += n
            shutil.rmtree(ds, ignore_errors=True)
            r = caller_itemise(idle, got, end)
            r.update(
                seq=seq,
                samples=n,
                sample_bytes=seq * row_bytes,
                inflight_tokens=inflight,
                wall_s=wall,
                sampler_reads=len(got),
                forward_s=a.forward_s,
            )
            if a.trace:  # the reads themselves: bytes in MB, RSS as growth over idle
                r["trace"] = [
                    {
                        k: round(v - got[0]["t"], 3)
                        if k == "t"
                        else v
                        if k in ("in_take", "in_add")
                        else round((v - idle[k] if k in ("rss", "anon") else v) / 1e6)
                        for k, v in s.items()
                    }
                    for s in got
                ]
            report["runs"][str(seq)] = r
            print(
                json.dumps(
                    {
                        "variant": variant,
                        "seq": seq,
                        **{
                            k: round(v / 1e9, 3)
                            for k, v in r["at_peak"].items()
                            if k not in ("in_take", "in_add")
                        },
                    }
                ),
                flush=True,
            )
    finally:
        stop.set()
        req_q.put(None)
        child.join(timeout=30)
        rx.stop()
        shutil.rmtree(ipc, ignore_errors=True)
    Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


# the caller's RSS growth at its peak, split into the stages that held the bytes then
CALLER_ITEMS = (
    ("receiver", "chunks the receiver holds (Receiver.parts: what the GPU sampler counted)"),
    ("chunks_in_take", "chunks popped by Receiver.take, not yet freed (stitching)"),
    ("stitch", "slots already concatenated inside take"),
    ("in_hand", "take returned, not yet passed to DatasetWriter.add"),
    ("writer", "DatasetWriter.host_bytes"),
    ("written", "written and let go by the writer, still referenced elsewhere"),
    ("frames_no_tensor", "zmq frames alive with no tensor over them"),
)


def caller_itemise(idle: dict, got: List[dict], end: dict) -> dict:
    def items(s: dict) -> dict:
        d = {
            "rss_growth": s["rss"] - idle["rss"],
            "anon_growth": s["anon"] - idle["anon"],
            "file_growth": s["file"] - idle["file"],
            "shmem_growth": s["shmem"] - idle["shmem"],
            "receiver": s["receiver"],
            "chunks_in_take": s["chunk"] - s["receiver"],
            "stitch": s["stitch"],
            "in_hand": s["in_hand"],
            "writer": s["writer"],
            "written": s["written"],
            "frames_no_tensor": s["frames_no_tensor"],
        }
        d["residual"] = d["rss_growth"] - sum(d[k] for k, _ in CALLER_ITEMS)
        d["gpu_sampler_unaccounted"] = d["rss_growth"] - d["receiver"] - d["writer"]
        d["in_take"], d["in_add"] = s["in_take"], s["in_add"]
        return d

    peak = max(got, key=lambda s: s["rss"])
    rows = [items(s) for s in got]
    return {
        "idle": {k: idle[k] for k in ("rss", "anon", "file", "shmem", "child_rss")},
        "at_peak": items(peak),
        "max": {k: max(r[k] for r in rows) for k in rows[0]},
        "mean": {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]},
        "after_close": items(end),
        "child_rss_max": max(s["child_rss"] for s in got),
    }


def caller_only(a) -> int:
    """Each variant in a fresh process (glibc's state and the idle baselines then match the
    GPU run's: the lengths in order, one process)."""
    import subprocess

    variants = a.variants.split(",")
    report = {
        "what": "the caller's RSS at 2K and 32K with no SGLang engine (mem_bench "
        "--caller-only): hsdump's scheduler-side code in a child process, the "
        "real CaptureEngine.run / Receiver / DatasetWriter in the caller",
        "hidden": a.hidden,
        "slots": 3,
        "chunk": a.chunk,
        "seqs": a.seqs,
        "forward_s": a.forward_s,
        "period_s": a.period,
        "items": dict(CALLER_ITEMS),
        "cpu": os.cpu_count(),
        "variants": {},
    }
    for v in variants:
        env = dict(os.environ)
        if v == "mmap-4m":
            env["GLIBC_TUNABLES"] = "glibc.malloc.mmap_threshold=4194304"
        part = tempfile.mktemp(prefix=f"memc-{v}-", suffix=".json")
        cmd = (
            [
                sys.executable,
                MEM_BENCH,
                "--caller-run",
                v,
                "--seqs",
                a.seqs,
                "--json",
                part,
                "--hidden",
                str(a.hidden),
                "--chunk",
                str(a.chunk),
                "--forward-s",
                str(a.forward_s),
                "--period",
                str(a.period),
                "--inflight-tokens",
                str(a.inflight_tokens),
            ]
            + (["--out-dir", a.out_dir] if a.out_dir else [])
            + (["--trace"] if a.trace else [])
        )
        subprocess.run(cmd, env=env, check=True)
        report["variants"][v] = json.loads(Path(part).read_text())
        os.unlink(part)
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1))
    report["summary"] = caller_summary(report)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    print(caller_table(report))
    print(json.dumps(report["summary"], indent=1))
    return 0


def caller_summary(report: dict) -> dict:
    """Per variant and length, GB: the caller's absolute RSS peak (idle + growth: the idle
    baseline of a later length carries what glibc kept from the earlier one), the time-mean
    of the bytes alive past the writer (`written`) and of frames alive with no tensor, and
    what the run left in RSS after the writer closed."""
    out = {}
    for v, rep in report["variants"].items():
        for seq, r in rep["runs"].items():
            out[f"{v} {seq}"] = {
                "idle": round(r["idle"]["rss"] / 1e9, 3),
                "peak_rss": round((r["idle"]["rss"] + r["at_peak"]["rss_growth"]) / 1e9, 3),
                "peak_growth": round(r["at_peak"]["rss_growth"] / 1e9, 3),
                "mean_written": round(r["mean"]["written"] / 1e9, 3),
                "mean_frames_no_tensor": round(r["mean"]["frames_no_tensor"] / 1e9, 3),
                "max_residual": round(r["max"]["residual"] / 1e9, 3),
                "left_after_close": round(r["after_close"]["rss_growth"] / 1e9, 3),
            }
    return out


def caller_table(report: dict) -> str:
    gb = lambda x: f"{x / 1e9:.2f}"  # noqa: E731
    keys = [k for k, _ in CALLER_ITEMS]
    rows = [
        "| variant | length x n | caller idle | RSS growth at peak (anon) | "
        + " | ".join(keys)
        + " | residual | GPU-sampler unaccounted | after close |",
        "|---|---|---:|---:|" + "---:|" * (len(keys) + 3),
    ]
    for v, rep in report["variants"].items():
        for seq, r in rep["runs"].items():
            p = r["at_peak"]
            rows.append(
                f"| {v} | {seq} x {r['samples']} | {gb(r['idle']['rss'])} | "
                f"+{gb(p['rss_growth'])} ({gb(p['anon_growth'])}) | "
                + " | ".join(gb(p[k]) for k in keys)
                + f" | {gb(p['residual'])} | {gb(p['gpu_sampler_unaccounted'])} | "
                f"+{gb(r['after_close']['rss_growth'])} |"
            )
    return "\n".join(rows)
