"""Host memory of a capture run, itemised per process and per buffer (issue 15 item 5).

One CaptureEngine (the GPU preset: 16,384-token chunks) and a DatasetWriter with the default
writer settings (6 threads x 256 MiB shards), the 8B shape by default, `engine.inflight_tokens`
set as `extract.py` sets it under the default `output.max_host_bytes` for each sequence length
(pipeline.rows_in_flight). Every 0.1 s a sampler reads:
  - the RSS of this process (the caller) and of each SGLang process (scheduler, detokenizer);
  - in the caller: the bytes of captured rows the receiver holds (chunks not yet taken) and
    the writer's `host_bytes` (the shard filling, the one queued, those being written).
For each length the table gives, at the moment the summed RSS peaked, each process's growth
over its idle RSS (engine up, nothing submitted) and the caller's buffers, and what is left
unaccounted in the caller. The scheduler's host staging per forward is the packed rows of one
chunk (tokens x (slots x hidden + slots) x 2 bytes, hs.to("cpu")), printed as "expected".

    source .gpu/part1/install.sh || exit 1; export PYTHONPATH=.:$PYTHONPATH
    python3 bench/mem_bench.py --seqs 2048:256,32768:16 --json $OUT/mem-llama8b.json
    python3 bench/mem_bench.py --device cpu --seqs 256:32,2048:8     # a plumbing check here
    python3 bench/mem_bench.py --writer-only --seqs 8192:24,32768:12 --out-dir /tmp  # no engine
    python3 bench/mem_bench.py --caller-only --seqs 2048:64,32768:6 \
        --json bench/results/mem-caller-cpu.json        # the caller alone, itemised (7 min, CPU)

--caller-only (caller_run) explains the GPU run's unitemised caller growth at 32K (+2.22 GB
with receiver and writer both at 0): the sampler above counts Receiver.parts, which take()
pops before it stitches, so the chunks (one sample) and the stitched copy (one more) being
made are invisible to it; and CaptureEngine._drive's `done`/`task` locals keep the previous
sample's finished task, so its rows outlive the writer (one more sample) until the next
sample completes. The variants measure fixes for both, and glibc's share.

Those three fixes landed in hsdump in c7e2081 (docs/performance.md, "Host memory"): on today's code
"as-is" already has them, and the fix-* variants patch nothing (`_patched` finds the fix in
place); run them on an older checkout to see the difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import psutil
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def proc_role(p: psutil.Process) -> str:
    try:
        name = " ".join(p.cmdline()[:1]) or p.name()
    except psutil.Error:
        return "gone"
    for role in ("scheduler", "detokenizer", "tokenizer", "data_parallel"):
        if role in name.lower():
            return role
    return "other:" + p.name()


class Sampler(threading.Thread):
    def __init__(self, eng, period: float = 0.1, tracker: "Optional[Tracker]" = None):
        super().__init__(name="mem-sampler", daemon=True)
        self.eng, self.writer, self.period, self.tracker = eng, None, period, tracker
        self.me = psutil.Process()
        self.samples: List[dict] = []
        self.stop_evt = threading.Event()

    def snapshot(self) -> dict:
        rss: Dict[str, int] = {"caller": self.me.memory_info().rss}
        for c in self.me.children(recursive=True):
            try:
                role = proc_role(c)
                rss[role] = rss.get(role, 0) + c.memory_info().rss
            except psutil.Error:
                pass
        rx = self.eng._rx
        with rx.cond:
            parts = [p for ps in rx.parts.values() for p in ps]
        recv = sum(t.numel() * t.element_size() for p in parts for t in p[1])
        w = self.writer
        # the Tracker's stages (install_tracker): chunks popped by take, its stitched copy,
        # a sample between take and add, written rows still referenced, bare frames
        c = self.tracker.counts() if self.tracker is not None else {}
        return {
            "t": time.time(),
            "rss": rss,
            "tree": sum(rss.values()),
            "receiver": recv,
            "writer": w.host_bytes if w is not None else 0,
            "tracked": {
                "chunks_in_take": max(c.get("chunk", 0) - recv, 0),
                **{k: c.get(k, 0) for k in ("stitch", "in_hand", "written", "frames_no_tensor")},
            },
        }

    def run(self):
        while not self.stop_evt.is_set():
            self.samples.append(self.snapshot())
            time.sleep(self.period)

    def take(self) -> List[dict]:
        out, self.samples = self.samples, []
        return out


def itemise(idle: dict, samples: List[dict], expected_staging: int) -> dict:
    peak = max(samples, key=lambda s: s["tree"])
    grow = {k: v - idle["rss"].get(k, 0) for k, v in peak["rss"].items()}
    tracked = peak.get("tracked", {})
    caller_known = peak["receiver"] + peak["writer"] + sum(tracked.values())
    return {
        "idle_rss": idle["rss"],
        "peak_rss": peak["rss"],
        "peak_tree": peak["tree"],
        "growth": grow,
        "at_peak": {"receiver": peak["receiver"], "writer": peak["writer"], **tracked},
        "caller_unaccounted": grow.get("caller", 0) - caller_known,
        "max": {
            "receiver": max(s["receiver"] for s in samples),
            "writer": max(s["writer"] for s in samples),
            "tree": peak["tree"],
            **{k: max(s.get("tracked", {}).get(k, 0) for s in samples) for k in tracked},
            **{f"rss_{k}": max(s["rss"].get(k, 0) for s in samples) for k in peak["rss"]},
        },
        "scheduler_expected_staging": expected_staging,
    }


def writer_only(a) -> int:
    """The writer's share alone, with no engine (runs on any machine): samples of rows at the
    model's width (constant values, so making them costs a memset) fed to a DatasetWriter as
    fast as it takes them; its host_bytes and this process's RSS sampled every 0.05 s."""
    from hsdump.store.manifest import Manifest
    from hsdump.store.writer import DatasetWriter

    if a.writer_module:  # another version of hsdump/store/writer.py, e.g. from `git show`
        import importlib.util

        spec = importlib.util.spec_from_file_location("hsdump.writer_other", a.writer_module)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        DatasetWriter = mod.DatasetWriter  # noqa: N806
    hidden, slots = a.hidden, 3
    me = psutil.Process()
    report = {"hidden": hidden, "slots": slots, "runs": []}
    for spec in a.writer_configs.split(","):
        threads, shard_mib = (int(x) for x in spec.split("x"))
        for seq, n in [tuple(int(x) for x in item.split(":")) for item in a.seqs.split(",")]:
            ds = tempfile.mkdtemp(prefix="hsdump-memw-", dir=a.out_dir)
            manifest = Manifest.for_rows(
                model="bench", hidden_size=hidden, num_hidden_layers=4, layers=[1, 2, 3]
            )
            w = DatasetWriter(
                os.path.join(ds, "d"), manifest, shard_bytes=shard_mib << 20, threads=threads
            )
            idle = me.memory_info().rss
            peak = {"rss": idle, "writer": 0}
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    peak["rss"] = max(peak["rss"], me.memory_info().rss)
                    peak["writer"] = max(peak["writer"], getattr(w, "host_bytes", 0))
                    time.sleep(0.05)

            th = threading.Thread(target=sample, daemon=True)
            th.start()
            t = time.time()
            for i in range(n):
                rows = [
                    torch.full((seq, hidden), float(i % 7 + j), dtype=torch.bfloat16)
                    for j in range(slots)
                ]
                w.add(i, [1] * seq, [1] * seq, rows, nonfinite=[])
                del rows
            w.close()
            stop.set()
            th.join()
            sample_bytes = seq * (slots * hidden * 2 + 16)
            r = {
                "threads": threads,
                "shard_mib": shard_mib,
                "seq": seq,
                "samples": n,
                "sample_bytes": sample_bytes,
                "wall_s": time.time() - t,
                "writer_module": a.writer_module,
                "writer_peak_host_bytes": getattr(w, "peak_host_bytes", None),
                "rss_idle": idle,
                "rss_growth_peak": peak["rss"] - idle,
                "bound": (threads + 2) * max(shard_mib << 20, sample_bytes),
                "shards": w.shards_written,
            }
            report["runs"].append(r)
            print(json.dumps(r), flush=True)
            shutil.rmtree(ds, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    print(
        "| writer | length | sample MB | shards | writer peak held GB | bound GB | RSS growth "
        "peak GB |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    for r in report["runs"]:
        print(
            f"| {r['threads']} x {r['shard_mib']} MiB | {r['seq']:,} | "
            f"{r['sample_bytes'] / 1e6:,.0f} | {r['shards']} | "
            f"{(r['writer_peak_host_bytes'] or 0) / 1e9:.2f} | {r['bound'] / 1e9:.2f} | "
            f"{r['rss_growth_peak'] / 1e9:.2f} |"
        )
    return 0


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
                __file__,
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--model", default="llama8b")
    ap.add_argument("--weights", default="dummy", choices=("dummy", "files"))
    ap.add_argument("--models-dir", default="/tmp/hsdump-bench-models")
    ap.add_argument("--seqs", default="2048:256,32768:16", help="length:samples,...")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--writer-only",
        action="store_true",
        help="no engine: the DatasetWriter's share alone (see writer_only)",
    )
    ap.add_argument("--hidden", type=int, default=4096, help="--writer-only: row width")
    ap.add_argument(
        "--writer-module",
        default=None,
        help="--writer-only: measure this writer.py instead (an older version)",
    )
    ap.add_argument(
        "--writer-configs", default="6x256,3x1024", help="--writer-only: threads x shard MiB, ..."
    )
    ap.add_argument(
        "--caller-only",
        action="store_true",
        help="no engine: the caller's share, itemised (see caller_run)",
    )
    ap.add_argument(
        "--variants",
        default=",".join(CALLER_VARIANTS),
        help="--caller-only: " + "; ".join(f"{k}: {v}" for k, v in CALLER_VARIANTS.items()),
    )
    ap.add_argument(
        "--caller-run", default=None, choices=tuple(CALLER_VARIANTS), help=argparse.SUPPRESS
    )  # one variant, in this process
    ap.add_argument("--chunk", type=int, default=16384, help="--caller-only: prefill chunk")
    ap.add_argument(
        "--forward-s",
        type=float,
        default=2.5,
        help="--caller-only: seconds per full-chunk forward. 2.5 is slower than "
        "the H200 but puts this 2-core machine's writer ahead of the capture, "
        "the GPU run's regime (its writer never held two 32K samples)",
    )
    ap.add_argument(
        "--inflight-tokens",
        type=int,
        default=131072,
        help="--caller-only: engine.inflight_tokens (the GPU preset's)",
    )
    ap.add_argument("--period", type=float, default=0.02, help="--caller-only: sampler period")
    ap.add_argument("--trace", action="store_true", help="--caller-only: keep every read")
    a = ap.parse_args(argv)
    if a.writer_only:
        return writer_only(a)
    if a.caller_run:
        return caller_run(a)
    if a.caller_only:
        return caller_only(a)

    import bench
    from hsdump.capture.layers import read_model_info, resolve_layers
    from hsdump.config import OutputConfig
    from hsdump.pipeline import rows_in_flight
    from hsdump.store.writer import DatasetWriter

    bench._prepare(a.device)
    from hsdump.capture.base import Request
    from hsdump.capture.start import rows_manifest, start

    model = a.model if a.device == "cuda" else "tiny-llama"
    path = bench.build_model(model, f"{a.models_dir}/{model}", a.weights)
    info = read_model_info(path)
    layers = resolve_layers(None, None, info.num_hidden_layers)
    row_bytes = len(layers) * info.hidden_size * 2
    seqs = [tuple(int(x) for x in item.split(":")) for item in a.seqs.split(",")]
    out = OutputConfig(dir="x")
    ec = bench.engine_config(a.device, 0.5)
    if a.weights == "dummy" and a.device == "cuda":
        ec = dataclasses.replace(ec, extra={"load_format": "dummy"})
    out_dir = a.out_dir or tempfile.mkdtemp(prefix="hsdump-mem-")
    tracker = Tracker()
    install_tracker(tracker)  # before the engine's receiver starts
    t = time.time()
    eng = start(path, layers, ec, info=info)
    report = {
        "model": model,
        "layers": layers,
        "row_bytes_per_token": row_bytes,
        "engine_start_s": time.time() - t,
        "writer": {"threads": out.writer_threads, "shard_bytes": out.shard_bytes},
        "max_host_bytes": out.max_host_bytes,
        "runs": {},
    }
    g = torch.Generator().manual_seed(0)
    hi = min(info.vocab_size, 30000)
    sampler = Sampler(eng, tracker=tracker)
    sampler.start()
    chunk = ec.chunked_prefill_size if ec.chunked_prefill_size > 0 else ec.max_prefill_tokens
    base = 0
    try:
        # warm-up (JIT), then the idle baseline: engine up, nothing in flight
        eng.run(
            [
                Request(base + i, torch.randint(100, hi, (min(seqs)[0],), generator=g).tolist())
                for i in range(2)
            ],
            lambda s: None,
        )
        base += 2
        for seq, n in seqs:
            inflight = rows_in_flight(out, ec.inflight_tokens, seq, row_bytes)
            eng.cfg = dataclasses.replace(eng.cfg, inflight_tokens=inflight)
            samples = [torch.randint(100, hi, (seq,), generator=g).tolist() for _ in range(n)]
            time.sleep(0.5)
            sampler.take()
            idle = sampler.snapshot()
            ds = os.path.join(out_dir, f"ds-{seq}")
            shutil.rmtree(ds, ignore_errors=True)
            manifest = rows_manifest(path, layers, info)
            w = DatasetWriter(ds, manifest, shard_bytes=out.shard_bytes, threads=out.writer_threads)
            sampler.writer = w

            def sink(s):
                tracker.mark(s.layers, "writer")  # counted by the writer's host_bytes from here
                w.add_sample(s)

            t = time.time()
            eng.run([Request(base + i, s, [1] * len(s)) for i, s in enumerate(samples)], sink)
            w.close()
            wall = time.time() - t
            base += n
            sampler.writer = None
            got = sampler.take()
            staging = min(chunk, seq * n) * (len(layers) * info.hidden_size + len(layers)) * 2
            r = itemise(idle, got, staging)
            r.update(
                seq=seq,
                samples=n,
                tokens=seq * n,
                wall_s=wall,
                inflight_tokens=inflight,
                sample_bytes=seq * row_bytes,
                writer_peak_host_bytes=w.peak_host_bytes,
                writer_bound=(out.writer_threads + 2) * max(out.shard_bytes, seq * row_bytes),
                rows_in_flight_bound=inflight * row_bytes,
            )
            report["runs"][str(seq)] = r
            shutil.rmtree(ds, ignore_errors=True)
            print(
                json.dumps(
                    {
                        "seq": seq,
                        "peak_tree_gb": r["peak_tree"] / 1e9,
                        "growth_gb": {k: v / 1e9 for k, v in r["growth"].items()},
                        "at_peak_gb": {k: v / 1e9 for k, v in r["at_peak"].items()},
                        "caller_unaccounted_gb": r["caller_unaccounted"] / 1e9,
                    }
                ),
                flush=True,
            )
            if a.json:
                Path(a.json).write_text(json.dumps(report, indent=1))
    finally:
        sampler.stop_evt.set()
        eng.close()
    print(table(report))
    return 0


def table(report: dict) -> str:
    gb = lambda x: f"{x / 1e9:.2f}"  # noqa: E731
    rows = [
        "| length x samples | peak tree RSS | caller idle -> growth | receiver rows (at peak / max) "
        "| writer held (at peak / max; bound) | in take / in hand / written / bare frames "
        "(at peak) | caller unaccounted | scheduler idle -> growth "
        "(expected staging) | detokenizer growth | rows in flight bound |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seq, r in report["runs"].items():
        g, idle, ap, mx = r["growth"], r["idle_rss"], r["at_peak"], r["max"]
        rows.append(
            f"| {seq} x {r['samples']} | {gb(r['peak_tree'])} | {gb(idle.get('caller', 0))} -> "
            f"+{gb(g.get('caller', 0))} | {gb(ap['receiver'])} / {gb(mx['receiver'])} | "
            f"{gb(ap['writer'])} / {gb(mx['writer'])}; {gb(r['writer_bound'])} | "
            f"{gb(ap.get('chunks_in_take', 0) + ap.get('stitch', 0))} / "
            f"{gb(ap.get('in_hand', 0))} / {gb(ap.get('written', 0))} / "
            f"{gb(ap.get('frames_no_tensor', 0))} | "
            f"{gb(r['caller_unaccounted'])} | {gb(idle.get('scheduler', 0))} -> "
            f"+{gb(g.get('scheduler', 0))} ({gb(r['scheduler_expected_staging'])}) | "
            f"+{gb(g.get('detokenizer', 0))} | {gb(r['rows_in_flight_bound'])} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
