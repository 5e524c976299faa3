"""`CaptureEngine`: `sglang.Engine` run in-process with hsdump's patch (hsdump.capture.patch) in
every scheduler, its rows received (hsdump.capture.rows) and handed on per request; and
`follow`, what a node other than node 0 runs in an engine over several nodes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from hsdump.capture.base import FORBID_ENV, CaptureSpec, EngineDied, Refused, Request, Sink
from hsdump.capture.families import family_of
from hsdump.capture.layers import ModelInfo
from hsdump.capture.nodes import (
    read_run_keys,
    receiver_endpoint,
    remove_run_keys,
    run_id,
    write_run_keys,
)
from hsdump.capture.rows import (
    CaptureError,
    Receiver,
    Sender,
    new_run_keys,
)
from hsdump.errors import Refusal

if TYPE_CHECKING:
    from hsdump.config import EngineConfig, ModelConfig
from hsdump.capture.patch import ENV, run_scheduler_process
from hsdump.capture.serving import (
    HEARTBEAT_S,
    check_supported,
    engine_kwargs,
    engine_layout,
    key_file,
    scheduler_spec,
    sglang_version,
)
from hsdump.store.layout import FINAL_KINDS

log = logging.getLogger(__name__)

_ACTIVE: Optional["CaptureEngine"] = None
ROWS_TIMEOUT_S = 120.0


def forbid_engine() -> None:
    """The test tiers' guard: a test that is not marked `engine` (it runs in `make test-fast`)
    must not start SGLang, in its own process or in one it starts."""
    who = os.environ.get(FORBID_ENV)
    if who:
        raise RuntimeError(
            f"{who} started a real SGLang engine but is not marked `engine`: run its "
            "bookkeeping on engine=dry, or mark it @pytest.mark.engine (docs/development.md)"
        )


# --------------------------------------------------------------------------- caller side
def _finish_reason(out: dict, what: str, sid=None):
    """A finished request's finish_reason; Refused if SGLang aborted it as a bad request (HTTP
    400: `validate_input_length` and the other request checks), else CaptureError."""
    reason = (out.get("meta_info") or {}).get("finish_reason") or {}
    if isinstance(reason, dict) and reason.get("type") == "abort":
        if reason.get("status_code") == 400 and sid is not None:
            raise Refused(sid, str(reason.get("message")))
        raise CaptureError(f"{what}: SGLang aborted the request: {reason.get('message')}")
    return reason


def _sigquit(signum=None, frame=None) -> None:
    """SIGQUIT handler for the caller (module-level: SGLang deep-copies its server args)."""
    if _ACTIVE is not None:
        _ACTIVE._on_sigquit()


def _child_processes():
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def follow(
    model_path: str,
    model_cfg: "ModelConfig",
    engine_cfg: "EngineConfig",
    layers: Sequence[int],
    info: ModelInfo,
    final: Sequence[str] = (),
    run_dir: Optional[str] = None,
    job_tag: str = "",
    key_timeout: float = 900.0,
    on_ready: Optional[Callable[[str], None]] = None,
) -> None:
    """A node k > 0 of an engine over several nodes: SGLang's schedulers of this node with
    hsdump's patch (those owning rows send them to node 0 over TCP), until node 0 is done.

    Waits for node 0's key file, sends node 0 a heartbeat every HEARTBEAT_S seconds, and
    returns when this node's schedulers exit (node 0 shut the engine down) or node 0 removed
    its key file (it closed). Raises EngineDied, after killing this node's schedulers, when
    node 0 stops taking heartbeats for engine.node_timeout seconds or a scheduler dies."""
    forbid_engine()
    layout = engine_layout(engine_cfg)
    if layout.is_head:
        raise Refusal("follow() runs on the nodes after node 0")
    check_supported(info, engine_cfg, model_cfg)
    family = family_of(info.architecture)
    keys_at = key_file(run_dir, job_tag)
    started = time.time()
    log.info(
        "node %d of %d: waiting for node 0's row keys in %s",
        layout.node_rank,
        layout.nnodes,
        keys_at,
    )
    rows_spec = read_run_keys(
        keys_at, timeout=key_timeout, run=run_id(), not_before=None if run_id() else started - 120
    )
    slots = len(layers) + len([k for k in FINAL_KINDS if k in final])
    os.environ[ENV] = json.dumps(
        scheduler_spec(
            rows_spec,
            layout,
            sorted(layers),
            final,
            engine_cfg.device,
            slots,
            info.hidden_size,
            family,
        )
    )
    beat = Sender.from_spec(
        rows_spec, f"node{layout.node_rank}", send_timeout=engine_cfg.node_timeout
    )
    lost: List[str] = []
    stop = threading.Event()

    def heartbeats():
        while not stop.wait(HEARTBEAT_S):
            try:
                beat.heartbeat(layout.node_rank)
            except CaptureError as e:
                lost.append(str(e))
                return

    from sglang.srt.entrypoints.engine import Engine

    class HsdumpEngine(Engine):
        run_scheduler_process_func = staticmethod(run_scheduler_process)

    kwargs = engine_kwargs(
        engine_cfg, model_path, model_cfg, sglang_version(), layers, False, family, layout
    )
    os.environ["SGLANG_BLOCK_NONZERO_RANK_CHILDREN"] = "0"  # return once the schedulers run
    threading.Thread(target=heartbeats, name="hsdump-heartbeat", daemon=True).start()
    engine = HsdumpEngine(**kwargs)
    children = _child_processes()
    if on_ready is not None:
        on_ready(
            f"node {layout.node_rank}: {len(children)} SGLang processes running; rows go "
            f"to node 0 at {rows_spec['endpoint']}"
        )
    try:
        while True:
            alive = [p for p in children if p.is_running() and p.status() != "zombie"]
            if not alive or not keys_at.exists():
                return  # node 0 shut the engine down, or closed
            if lost:
                raise EngineDied(
                    f"node {layout.node_rank}: node 0 ({rows_spec['endpoint']}) "
                    f"stopped taking this node's heartbeats: {lost[0]}"
                )
            if len(alive) < len(children):
                raise EngineDied(f"node {layout.node_rank}: an SGLang process exited")
            time.sleep(0.5)
    finally:
        stop.set()
        for p in _child_processes():
            with contextlib.suppress(Exception):
                p.kill()
        with contextlib.suppress(Exception):
            beat.close(linger_s=0)
        del engine


class CaptureEngine:
    """open -> run(requests, sink) -> close. Implements hsdump.capture.base.Engine with SGLang."""

    def __init__(self, spec: CaptureSpec):
        """spec.generates: the run will call `generate` (decode steps), not only `run`
        (prefill). spec.run_dir, spec.job_tag: the output folder and the job's tag, where an
        engine over several nodes hands its row keys to the other nodes
        (hsdump.capture.nodes.write_run_keys)."""
        forbid_engine()
        self.spec = spec
        model_path, model_cfg, engine_cfg, info = (
            spec.model_path,
            spec.model,
            spec.engine,
            spec.info,
        )
        layers, generates, run_dir, job_tag = (
            spec.layers,
            spec.generates,
            spec.run_dir,
            spec.job_tag,
        )
        self.version = check_supported(info, engine_cfg, model_cfg)
        self.generates = generates
        self.layers = list(layers)
        self.final = spec.engine_final
        self.hidden = info.hidden_size
        self.cfg = engine_cfg
        # aux rows arrive in ascending layer order, then the final states; this puts the
        # layers in the user's order, followed by the final states
        order = sorted(range(len(layers)), key=lambda j: layers[j])
        self._slot = [order.index(j) for j in range(len(layers))]
        self._slot += [len(layers) + f for f in range(len(self.final))]
        self.family = family_of(info.architecture)
        self.layout = engine_layout(engine_cfg)
        self._ipc_dir = tempfile.mkdtemp(prefix="hsdump-")
        self._key_file: Optional[Path] = None
        if self.layout.multi:
            if not self.layout.is_head:
                raise Refusal(
                    f"node_rank={self.layout.node_rank}: only node 0 captures; "
                    "the other nodes run hsdump.capture.engine.follow"
                )
            # rows from the other nodes' schedulers come over TCP, authenticated with this
            # run's keys, handed to those nodes through a 0600 file in the output folder
            self._rx = Receiver(receiver_endpoint(self.layout), keys=new_run_keys())
            rows_spec = self._rx.sender_spec()
            self._key_file = write_run_keys(key_file(run_dir, job_tag), rows_spec, run=run_id())
        else:
            self._rx = Receiver(f"ipc://{self._ipc_dir}/rows")
            rows_spec = self._rx.sender_spec()
        self._rx.start()
        os.environ[ENV] = json.dumps(
            scheduler_spec(
                rows_spec,
                self.layout,
                self.layers,
                self.final,
                engine_cfg.device,
                len(self._slot),
                info.hidden_size,
                self.family,
            )
        )
        from sglang.srt.entrypoints.engine import Engine

        class HsdumpEngine(Engine):
            run_scheduler_process_func = staticmethod(run_scheduler_process)

        kwargs = engine_kwargs(
            engine_cfg,
            model_path,
            model_cfg,
            self.version,
            self.layers,
            generates,
            self.family,
            self.layout,
        )
        kwargs["custom_sigquit_handler"] = _sigquit
        global _ACTIVE
        _ACTIVE = self
        log.info("starting sglang %s engine: %s", self.version, kwargs)
        t0 = time.time()
        self._died: Optional[str] = None
        self._stop_requested = False
        self._aborted = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._wake: Optional[asyncio.Future] = None
        # SGLang's processes inherit ignored SIGINT/SIGTERM (a terminal's Ctrl-C reaches the
        # whole process group); the caller alone acts on them, once the engine is up.
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._engine = HsdumpEngine(**kwargs)
        except BaseException:
            self._rx.stop()
            if self._key_file is not None:
                remove_run_keys(self._key_file)
            for p in _child_processes():  # a failed start leaves no SGLang process behind
                with contextlib.suppress(Exception):
                    p.kill()
            raise
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        signal.signal(signal.SIGQUIT, _sigquit)
        self._ready_at = time.monotonic()
        # SGLang's own longest prompt (its scheduler's max_req_input_len, less one: it refuses
        # len >= that); hsdump.capture.layers.engine_limit predicts it before the start
        took = getattr(self._engine.tokenizer_manager, "max_req_input_len", None)
        self.max_prompt_tokens: Optional[int] = int(took) - 1 if took else None
        self._children = _child_processes()
        self._watchdog = threading.Thread(target=self._watch, name="hsdump-watchdog", daemon=True)
        self._watchdog.start()
        log.info("engine ready in %.1f s", time.time() - t0)

    # ---------------------------------------------------------------- health
    def _fail(self, message: str) -> None:
        if self._died is None:
            self._died = message
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(
                lambda: self._wake.done() or self._wake.set_result(None)
            )

    def _on_sigquit(self, signum=None, frame=None) -> None:
        # SGLang's children send SIGQUIT to the caller when they fail
        self._fail("an SGLang process failed (its traceback is in the log above)")

    def _watch(self) -> None:
        while self._died is None:
            for p in self._children:
                try:
                    alive = p.is_running() and p.status() != "zombie"
                except Exception:
                    alive = False
                if not alive:
                    self._fail(f"SGLang process {p.pid} exited")
                    return
            silent = self._silent_node()
            if silent:
                self._fail(silent)
                return
            time.sleep(0.5)

    def _silent_node(self) -> Optional[str]:
        """The first other node of this engine whose heartbeats stopped, said as an error."""
        if not self.layout.multi:
            return None
        now, limit = time.monotonic(), self.cfg.node_timeout
        with self._rx.cond:
            beats = dict(self._rx.heartbeats)
        for node in range(1, self.layout.nnodes):
            last, host = beats.get(node, (self._ready_at, "?"))
            if now - last > limit:
                return (
                    f"node {node} (host {host}) of this engine sent no heartbeat for "
                    f"{now - last:.0f} s (engine.node_timeout={limit:g}): it died or lost "
                    "its link to node 0. Committed samples stay; run the same command on "
                    "every node again to resume"
                )
        return None

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def request_stop(self) -> None:
        """Stop submitting samples; those in flight finish. Safe to call from a signal handler."""
        self._stop_requested = True
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(
                lambda: self._wake.done() or self._wake.set_result(None)
            )

    def abort(self) -> None:
        """Stop at once: `run` raises KeyboardInterrupt without waiting for samples in flight."""
        self._aborted = True
        self.request_stop()

    def _install_signal_handlers(self, on_stop_signal: Optional[Callable[[str], None]]):
        """SIGTERM and SIGQUIT belong to SGLang's tokenizer manager, which installs its own
        handlers on the event loop at the first request: give it hsdump's handler class.
        SIGINT (which SGLang leaves alone) gets a plain handler for the run."""
        engine = self

        class Handlers:
            def __init__(self, tokenizer_manager):
                pass

            def sigterm_handler(self, signum=None, frame=None):
                if on_stop_signal is not None:
                    on_stop_signal("SIGTERM")

            def running_phase_sigquit_handler(self, signum=None, frame=None):
                engine._on_sigquit()

        self._engine.tokenizer_manager.signal_handler_class = Handlers
        if on_stop_signal is None:
            return None
        return signal.signal(signal.SIGINT, lambda signum, frame: on_stop_signal("SIGINT"))

    # ---------------------------------------------------------------- driving
    def run(
        self,
        samples: Iterable[Request],
        sink: Sink,
        on_stop_signal: Optional[Callable[[str], None]] = None,
        refused: Optional[Callable[[int, str], None]] = None,
        gate=None,
    ) -> bool:
        """Capture every Request and call `sink(CapturedSample)` in completion order (its
        nonfinite indices found on the device, in the spec's order).
        `on_stop_signal(name)` is called on SIGINT / SIGTERM while it runs; `refused(sample_id,
        message)` for a sample SGLang refuses as a bad request (without it, run raises Refused).
        Returns False if `request_stop()` ended it early; raises KeyboardInterrupt after
        `abort()`, EngineDied if SGLang died. `gate.wait(request)` (hsdump.capture.base.Gate)
        is awaited before each request is submitted, as a task beside those in flight."""
        self._tag = uuid.uuid4().hex[:8]  # request ids unique per run: a sample id may recur
        return self._run_on_loop(self._drive(iter(samples), sink, refused, gate), on_stop_signal)

    def generate(
        self,
        requests: Sequence[Tuple[object, List[int], dict]],
        on_stop_signal: Optional[Callable[[str], None]] = None,
    ) -> Dict[object, dict]:
        """Generate a continuation of each (key, input_ids, sampling_params), nothing captured:
        {key: {"text", "output_ids", "finish_reason"}}. All requests are submitted at once and
        SGLang's scheduler batches them (generation holds no captured rows on the host, so
        `inflight_tokens` does not bound it: unbounded, 256 requests of 512 + 256 tokens ran at
        1.006 of SGLang's own batched generate on an H200, docs/reports/2026-11-30-regeneration.md). The
        caller bounds the number (regenerate.window). Raises EngineDied if SGLang died;
        returns what finished if `request_stop()` ended it early."""
        return self._run_on_loop(self._generate(list(requests)), on_stop_signal)

    def _run_on_loop(self, coro, on_stop_signal):
        """Run `coro` on SGLang's event loop with hsdump's stop-signal handlers."""
        loop = self._engine.loop
        self._loop = loop
        old_sigint = self._install_signal_handlers(on_stop_signal)
        try:
            return loop.run_until_complete(coro)
        finally:
            if old_sigint is not None:
                signal.signal(signal.SIGINT, old_sigint)

    async def _generate(self, requests) -> Dict[object, dict]:
        tag = uuid.uuid4().hex[:8]

        async def one(i, key, ids, sp):
            out = await self._engine.async_generate(
                input_ids=list(ids), sampling_params=sp, rid=f"hsdump-gen-{tag}-{i}"
            )
            reason = _finish_reason(out, f"generation for {key}")
            return key, {
                "text": out.get("text", ""),
                "output_ids": out.get("output_ids"),
                "finish_reason": reason,
            }

        tasks = {
            asyncio.ensure_future(one(i, key, ids, sp)) for i, (key, ids, sp) in enumerate(requests)
        }
        results: Dict[object, dict] = {}
        self._wake = asyncio.get_running_loop().create_future()
        try:
            while tasks and not self._stop_requested:  # stopped: the rest is cancelled
                self._check_alive()
                done, tasks = await asyncio.wait(
                    tasks | {self._wake}, return_when=asyncio.FIRST_COMPLETED
                )
                tasks.discard(self._wake)
                for task in done:
                    if task is self._wake:
                        self._wake = asyncio.get_running_loop().create_future()
                        continue
                    key, res = task.result()
                    results[key] = res
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        return results

    def input_logprobs(
        self,
        requests: Sequence[Tuple[object, List[int]]],
        on_stop_signal: Optional[Callable[[str], None]] = None,
    ) -> Dict[object, List[Optional[float]]]:
        """SGLang's logprob of each input token given the tokens before it (the first: None) for
        each (key, input_ids), from a request of its own (`return_logprob`, from position 0),
        nothing captured: hsdump.check_final's in-run final-state check."""
        return self._run_on_loop(self._input_logprobs(list(requests)), on_stop_signal)

    async def _input_logprobs(self, requests) -> Dict[object, List[Optional[float]]]:
        tag = uuid.uuid4().hex[:8]

        async def one(i, key, ids):
            out = await self._engine.async_generate(
                input_ids=list(ids),
                sampling_params={"max_new_tokens": 1, "temperature": 1.0},
                return_logprob=True,
                logprob_start_len=0,
                rid=f"hsdump-logprob-{tag}-{i}",
            )
            _finish_reason(out, f"the logprobs of {key}")
            lps = out["meta_info"]["input_token_logprobs"]
            return key, [None if t[0] is None else float(t[0]) for t in lps]

        self._check_alive()
        done = await asyncio.gather(*(one(i, k, ids) for i, (k, ids) in enumerate(requests)))
        return dict(done)

    def _check_alive(self) -> None:
        if self._died is not None:
            raise EngineDied(self._died)
        if self._aborted:
            raise KeyboardInterrupt

    async def _one(self, req: Request):
        sid, ids = req.sid, list(req.input_ids)
        rid = f"hsdump-{self._tag}-{sid}"
        try:
            try:
                out = await self._engine.async_generate(
                    input_ids=ids,
                    sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                    return_hidden_states=True,
                    rid=rid,
                )
            except ValueError as e:  # the tokenizer manager's request checks (length, ...)
                raise Refused(sid, str(e)) from None
            _finish_reason(out, f"sample {sid}", sid)
            loop = asyncio.get_running_loop()
            rows, bad = await loop.run_in_executor(
                None, self._rx.take, rid, len(ids), ROWS_TIMEOUT_S
            )
        except BaseException:
            self._rx.discard(rid)
            raise
        # rows: one [seq, H] tensor per slot (sorted layers, then final) -> the user's order
        return self.spec.sample(
            req, [rows[s] for s in self._slot], [j for j, s in enumerate(self._slot) if s in bad]
        )

    async def _drive(self, samples, sink: Sink, refused=None, gate=None) -> bool:
        budget = self.cfg.inflight_tokens
        inflight: Dict[asyncio.Future, int] = {}
        used = 0
        nxt = next(samples, None)
        gated: Optional[asyncio.Future] = None  # gate.wait(nxt), awaited beside the requests
        self._wake = asyncio.get_running_loop().create_future()
        try:
            while True:
                self._check_alive()
                if self._stop_requested:
                    nxt = None
                if nxt is None and not inflight:
                    return not self._stop_requested
                while nxt is not None and (not inflight or used + len(nxt.input_ids) <= budget):
                    if gate is not None:
                        if gated is None:
                            gated = asyncio.ensure_future(gate.wait(nxt))
                        if not gated.done():
                            break
                        gated, ready = None, gated
                        ready.result()  # the gate's stop: raised here
                        if self._stop_requested:  # a stop while it waited: nothing more goes
                            nxt = None
                            break
                    inflight[asyncio.ensure_future(self._one(nxt))] = len(nxt.input_ids)
                    used += len(nxt.input_ids)
                    nxt = next(samples, None)
                if self._wake.done():
                    self._wake = asyncio.get_running_loop().create_future()
                waiting = list(inflight) + [self._wake] + ([gated] if gated is not None else [])
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is self._wake or task is gated:
                        continue
                    used -= inflight.pop(task)
                    try:
                        result = task.result()
                    except Refused as e:
                        if refused is None:
                            raise
                        refused(e.sid, e.reason)
                        continue
                    sink(result)
                # a finished task holds its sample's rows: these names kept the last one alive
                # through the next wait, after the writer had written it (one sample, 0.81 GB
                # at 32K x 8B, measured with bench/mem_bench.py --caller-only)
                done = task = result = None
        finally:
            if gated is not None:
                inflight[gated] = 0
            for task in inflight:
                task.cancel()
            if inflight:
                await asyncio.gather(*inflight, return_exceptions=True)

    def sources(self) -> Dict[str, Dict[str, int]]:
        """Rows received per sending scheduler process ({"dp0-tp0-pid..": {"messages",
        "rows"}}): one entry per DP group's attention-TP rank 0 (or per replica)."""
        with self._rx.cond:
            return {k: dict(v) for k, v in self._rx.sources.items()}

    def close(self) -> None:
        self._died = self._died or "closed"  # stops the watchdog
        try:
            self._engine.shutdown()
        finally:
            self._rx.stop()
            if self._key_file is not None:  # tells the other nodes this run is over
                remove_run_keys(self._key_file)
            try:
                for p in Path(self._ipc_dir).iterdir():
                    p.unlink()
                os.rmdir(self._ipc_dir)
            except OSError:
                pass

    def __enter__(self) -> "CaptureEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
