"""The capture side of a train-while-capturing run (`python extract.py online=specforge
online.folder=DIR ...`): hsdump's own pipeline, once per epoch, into FOLDER/store/epochNNNN,
on one engine started by the first epoch (`open_engine`), with two hooks more
(hsdump.pipeline.run's `hooks`):

- `plan(job, corpus)`: the epoch's order (`order`), the samples SpecForge would drop skipped
  (recorded, so a resumed run goes past them), the trainer's schedule written;
- `gate(engine)`: a `DiskGate` the engine awaits before each request, in its own request loop:
  it lets the request go while the samples on disk (committed shards not yet deleted by the
  trainer) plus those admitted and not yet committed, plus this one, fit in `cap_bytes`; else it
  commits the shard the writer is filling (so the trainer can go on) and waits.

A publisher thread tails the epoch's commit log and appends one ref line per committed sample to
SpecForge's ref channel, in the epoch's order. The engine, the writer and the reader stay as
they are: the producer only orders requests, holds them back and reads commit logs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional

from hsdump.errors import Refusal
from hsdump.online import folder as F
from hsdump.pipeline import Interrupted
from hsdump.store.layout import TOKEN_FREQ

log = logging.getLogger(__name__)

HEADER_PER_TENSOR = 160  # safetensors header bytes per tensor, an upper bound for hsdump's names
HEADER_PER_SHARD = 2048  # its __metadata__ (layers, final, versions) and alignment


class Stop(Interrupted):
    """The trainer finished, failed or went silent: capture stops (what is committed stays)."""

    def __init__(self, message: str, clean: bool = False):
        super().__init__(message)
        self.clean = clean  # the trainer finished: not an error


def sample_bytes(tokens: int, hidden: int, slots: int, dtype: str) -> int:
    """An upper bound of the bytes a sample of `tokens` tokens takes in a shard: its ids and
    mask, `slots` [tokens, hidden] states in storage `dtype` (fp8: with their scales), and a
    header share."""
    from hsdump.store.fp8 import is_fp8
    from hsdump.store.layout import STORAGE_BYTES

    fp8 = is_fp8(dtype)
    row = hidden * STORAGE_BYTES[dtype] + (4 if fp8 else 0)
    tensors = 2 + slots * (2 if fp8 else 1)
    return tokens * (16 + slots * row) + HEADER_PER_TENSOR * tensors + HEADER_PER_SHARD


def least_cap(quantum: int, sample_max: int, cap: int = 1) -> int:
    """The least online.cap_bytes a cap of `cap` passes: the trainer's first window
    (`quantum` samples) and one sample more of `sample_max` bytes, and a shard (cap // 4)."""
    return (quantum + 1) * sample_max + max(1, cap // 4)


def kind_plan(manifest: dict, kind: str) -> dict:
    """What the store needs to serve drafter `kind` from a dataset of this manifest: its
    layers' positions among the captured ones (`pick`, as `hsdump export --kind` picks them)
    and the final state its SpecForge records carry (`final`: post-norm for EAGLE-3 and DSpark,
    none for DFlash and Domino)."""
    from hsdump.tools.export import pick_kind

    ds = SimpleNamespace(layers=list(manifest["layers"]), path="the capture")
    chosen = pick_kind(ds, manifest, kind)
    return dict(
        layers=chosen["layers"],
        pick=chosen["pick"],
        serving_ids=chosen["serving_ids"],
        final="post_norm" if kind in ("eagle3", "dspark") else None,
    )


def epoch_order(ids: List[int], epoch: int, seed: int) -> List[int]:
    """Epoch `epoch`'s order of the sample ids `ids`: the order SpecForge 0.2.0's offline
    trainer reads an `hsdump export --to specforge` of them in that epoch (its reader sorts the
    files' paths, its sampler permutes them with torch.randperm seeded seed + epoch), so a
    run through the folder and an offline run on the export train on the same batches."""
    import torch

    listed = file_order(ids)
    g = torch.Generator()
    g.manual_seed(int(seed) + int(epoch))
    return [listed[k] for k in torch.randperm(len(listed), generator=g).tolist()]


def file_order(ids: List[int]) -> List[int]:
    """The sample ids `ids` in the order SpecForge 0.2.0's offline reader lists the files of
    an `hsdump export --to specforge` of them (sorted paths: data_10 before data_2)."""
    from hsdump.tools.export import rel_path

    ids = sorted(ids)
    return [ids[i] for i in sorted(range(len(ids)), key=lambda i: rel_path("specforge", i))]


class Producer:
    """One train-while-capturing run of `cfg` (cfg.online.folder set)."""

    def __init__(self, cfg, resolved_config: Optional[dict] = None):
        self.cfg, self.resolved = cfg, resolved_config
        self.o = cfg.online
        self.folder = Path(self.o.folder)
        self.lock = threading.Lock()
        self.book = F.ShardBook(self.folder)
        self.published: set = set()
        self.order: Dict[int, List[int]] = {}
        self.pos: Dict[int, int] = {}
        self.admitted: Dict[str, int] = {}  # admitted, not yet committed: estimated bytes
        self.epoch = 0
        self.writer = None
        self.engine = None
        self.plan_doc: Optional[dict] = None
        self.stats = dict(
            samples_published=0, gate_wait_s=0.0, peak_accounted=0, gated=0, engine_starts=0
        )
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._peer_checked = 0.0
        self._t0 = time.time()

    # ------------------------------------------------------------------ the run
    def check(self) -> None:
        """Refuse, before anything is loaded, what the folder protocol cannot do."""
        c, o = self.cfg, self.o
        if c.dist.num_jobs != 1:
            raise Refusal("online.folder: one capture job feeds the trainer; set dist.num_jobs=1")
        if c.regenerate.enabled:
            raise Refusal(
                "online.folder does not regenerate answers: regenerate first into a dataset "
                "(regenerate=last), then train from it offline, or capture with regenerate=none"
            )
        if o.kind not in c.capture.kinds:
            raise Refusal(
                f"online.kind={o.kind} but capture.kinds={list(c.capture.kinds)}: add "
                f"capture.kinds=[{o.kind}] so the capture holds its layers"
            )
        if o.kind == "eagle3" and "post_norm" not in c.capture.final:
            raise Refusal(
                "online.kind=eagle3: SpecForge's EAGLE-3 reads the post-norm final state; add "
                "capture.final=[post_norm]"
            )
        if F.side(self.folder, F.DONE) is not None:
            raise Refusal(
                f"{self.folder}: its trainer finished this run (.consumer_done); use a new "
                "online.folder for another run"
            )

    def run(self) -> dict:
        from hsdump.pipeline import node_layout
        from hsdump.pipeline import run as capture_run

        if not node_layout(self.cfg).is_head:  # its share of the one engine, until node 0 ends
            return dict(follower=capture_run(self._epoch_cfg(0), self.resolved).to_dict())
        self.check()
        (self.folder / "control").mkdir(parents=True, exist_ok=True)
        (self.folder / F.STORE).mkdir(parents=True, exist_ok=True)
        for stale in (F.FAILED, F.CONSUMER_FAILED):  # a stopped attempt's: this one resumes it
            if F.side(self.folder, stale) is not None:
                log.warning("online: %s%s of an earlier attempt removed", F.REFS, stale)
                Path(str(F.refs_path(self.folder)) + stale).unlink()
        self.published = set(F.published_ids(self.folder))
        self.stats["samples_published"] = len(self.published)
        thread = threading.Thread(target=self._publish_loop, name="hsdump-publisher", daemon=True)
        thread.start()
        try:
            summaries = []
            for e in range(self.o.epochs):
                self.epoch = e
                ecfg = self._epoch_cfg(e)
                t = time.time()
                s = capture_run(ecfg, self.resolved, hooks=self)
                self._drain(e)
                summaries.append(dict(epoch=e, written=s.written, wall_s=round(time.time() - t, 3)))
                log.info("online: epoch %d captured and published (%d written)", e, s.written)
            self._close_engine()  # its memory to the trainer while the last windows train
            F.write_side(self.folder, F.CLOSED, "")
            stopped = self._await_trainer()
            dropped = self._cleanup()
            return dict(
                epochs=summaries,
                samples_published=self.stats["samples_published"],
                dropped_at_end=dropped,
                stopped=stopped,
                gate_wait_s=round(self.stats["gate_wait_s"], 3),
                peak_accounted_bytes=self.stats["peak_accounted"],
                engine_starts=self.stats["engine_starts"],
            )
        except Stop as e:
            if e.clean:  # the trainer reached its steps first: what it did not train goes
                log.warning("online: %s", e)
                return dict(
                    stopped=str(e),
                    samples_published=self.stats["samples_published"],
                    engine_starts=self.stats["engine_starts"],
                    dropped_at_end=self._cleanup(),
                )
            raise
        except Refusal:  # bad input, nothing run: the trainer waits for the corrected command
            raise
        except BaseException as e:  # stopped or failed: SpecForge's consumer stops on it
            why = "stopped" if isinstance(e, (Interrupted, KeyboardInterrupt)) else "failed"
            F.write_side(
                self.folder,
                F.FAILED,
                f"hsdump producer {why}: {type(e).__name__}: {e} (run the same capture "
                "command to resume it, and the trainer with training.resume_from)",
            )
            raise
        finally:
            try:
                self._close_engine()
            finally:
                self._stop.set()
                thread.join(timeout=5)

    def _epoch_cfg(self, e: int):
        c, o = self.cfg, self.o
        out = c.output
        shard = (
            out.shard_bytes if not o.cap_bytes else max(1, min(out.shard_bytes, o.cap_bytes // 4))
        )
        # one writer thread: shards commit in the order they fill (the publisher's order is
        # the epoch's anyway; fewer shards held back)
        out = dataclasses.replace(
            out, dir=str(F.epoch_dir(self.folder, e)), shard_bytes=shard, writer_threads=1
        )
        return dataclasses.replace(c, output=out)

    # ------------------------------------------------------------------ hooks
    def plan(self, job, corpus) -> None:
        """hsdump.pipeline's hook: this epoch's order and the trainer's dropped samples."""
        data, writer = corpus.data, job.writer
        self.writer = writer
        keep = [sid for sid, m in zip(data.ids, data.loss_mask) if F.trainer_keeps(self.o.kind, m)]
        order = epoch_order(keep, self.epoch, self.o.seed)
        index = {sid: i for i, sid in enumerate(data.ids)}
        todo = set(job.todo)
        dropped = [i for i in job.todo if not F.trainer_keeps(self.o.kind, data.loss_mask[i])]
        for i in dropped:  # recorded, as the trainer's filter would drop them: not captured
            writer.skip(data.ids[i], f"SpecForge's {self.o.kind} filter drops it (online)")
        job.todo = [index[sid] for sid in order if index[sid] in todo]
        if self.plan_doc is None:
            self._write_plan(writer.manifest, len(order), data)
            if self.o.kind == "eagle3" and not (self.folder / TOKEN_FREQ).exists():
                self._write_counts(data, keep, index)
        # then the publisher sees the epoch: its refs need the plan (a restarted capture has
        # committed samples to publish at once)
        with self.lock:
            self.order[self.epoch] = order
            self.pos.setdefault(self.epoch, 0)

    def _write_counts(self, data, keep: List[int], index: Dict[int, int]) -> None:
        """FOLDER/token_freq.json for EAGLE-3's vocabulary map (hsdump.online.vocab): the
        kept samples' loss-masked ids, in the order SpecForge's offline trainer counts them."""
        from hsdump.online.vocab import ordered_counts, write_counts

        pos = [index[sid] for sid in file_order(keep)]
        pairs = ordered_counts((data.input_ids[i], data.loss_mask[i]) for i in pos)
        longest = max((int(data.lengths[i]) for i in pos), default=0)
        write_counts(self.folder, pairs, len(pos), longest)

    def open_engine(self, start):
        """hsdump.pipeline's hook: one engine for every epoch, started by the first
        (`start()`), closed by `run` when the last epoch is captured or the run stops."""
        if self.engine is None:
            self.engine = start()
            self.stats["engine_starts"] += 1
        return self.engine

    def _close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()

    def gate(self, engine):
        self.engine = engine
        return DiskGate(self)

    # ------------------------------------------------------------------ the plan
    def _write_plan(self, manifest, n: int, data) -> None:
        o = self.o
        layers = list(manifest.layers)
        doc = json.loads(json.dumps(dataclasses.asdict(manifest), default=str))
        chosen = kind_plan(doc, o.kind)
        final = chosen["final"]
        quantum = o.dp_size * o.batch_size * o.accumulation_steps
        max_len = o.max_length or self.cfg.dataset.max_seq_len or max(data.lengths)
        plan = dict(
            format="hsdump/online-specforge",
            version=1,
            kind=o.kind,
            layers=layers,
            kind_layers=chosen["layers"],
            pick=chosen["pick"],
            serving_ids=chosen["serving_ids"],
            final=final,
            max_length=int(max_len),
            epochs=o.epochs,
            seed=o.seed,
            samples_per_epoch=n,
            quantum=quantum,
            cap_bytes=o.cap_bytes,
            sample_bytes_max=self.estimate(int(max_len)),
        )
        need = least_cap(quantum, plan["sample_bytes_max"], o.cap_bytes)
        if o.cap_bytes and o.cap_bytes < need:
            raise Refusal(
                f"online.cap_bytes={o.cap_bytes} holds less than the trainer's first window: "
                f"{quantum} samples (dp {o.dp_size} x batch {o.batch_size} x accumulation "
                f"{o.accumulation_steps}) of up to {plan['sample_bytes_max']:,} bytes each "
                f"(dataset.max_seq_len), one more being captured and a shard: set "
                f"online.cap_bytes >= {need}, or lower dataset.max_seq_len"
            )
        path = self.folder / F.PLAN
        if path.exists():
            old = json.loads(path.read_text())
            diff = [k for k in plan if k != "cap_bytes" and old.get(k) != plan[k]]
            if diff:
                raise Refusal(
                    f"{path} records another run ({', '.join(diff)} differ); resume it with the "
                    "same settings, or use a new online.folder"
                )
        F.write_atomic(path, json.dumps(plan, indent=1) + "\n")
        sched = Path(str(F.refs_path(self.folder)) + F.SCHEDULE)
        if not sched.exists():  # SpecForge's own producer writes it: the consumer reads it
            payload = dict(
                version=1,
                total_steps=F.total_steps(n, o.epochs, quantum),
                num_prompts=n,
                prompt_epochs=o.epochs,
                prompt_seed=o.seed,
                dp_size=o.dp_size,
                batch_size=o.batch_size,
                accumulation_steps=o.accumulation_steps,
            )
            if payload["total_steps"] < 1:
                raise Refusal(
                    f"{n} samples x {o.epochs} epochs make no optimizer window of {quantum}: "
                    "capture more samples or lower online.batch_size"
                )
            F.write_atomic(sched, json.dumps(payload, sort_keys=True))
        self.plan_doc = plan

    def estimate(self, tokens: int) -> int:
        """An upper bound of a sample's bytes in a shard (tensors plus header)."""
        w = self.writer
        return sample_bytes(tokens, w.hidden, len(w.layers) + len(w.final), self.cfg.output.dtype)

    # ------------------------------------------------------------------ accounting
    def on_disk(self) -> int:
        return sum(b for _, b in self.book.resident())

    def admit(self, request) -> bool:
        """Under the lock: whether `request` fits now; if so it is counted in."""
        name = F.sample_id(self.epoch, request.sid)
        need = self.estimate(len(request.input_ids))
        used = self.on_disk() + sum(self.admitted.values())
        self.stats["peak_accounted"] = max(self.stats["peak_accounted"], used)
        if self.o.cap_bytes and used and used + need > self.o.cap_bytes:
            return False
        self.admitted[name] = need
        self.stats["peak_accounted"] = max(self.stats["peak_accounted"], used + need)
        return True

    def check_peers(self, every_s: float = 0.2) -> None:
        """Raise Stop when the trainer finished, failed or went silent (checked every
        `every_s`); a trainer whose quantum differs from online.*'s is refused."""
        now = time.time()
        if now - self._peer_checked < every_s:
            return
        self._peer_checked = now
        if self._error is not None:
            raise self._error
        failed = F.side(self.folder, F.CONSUMER_FAILED)
        if failed is not None:
            raise Stop(f"the trainer failed: {failed.strip()}")
        if F.side(self.folder, F.DONE) is not None:
            raise Stop("the trainer finished (it reached its steps): capture stops", clean=True)
        q = F.side(self.folder, F.QUANTUM)
        want = self.plan_doc["quantum"] if self.plan_doc else None
        if q and want and int(q) != want:
            raise Stop(
                f"the trainer takes {int(q)} samples an optimizer step, online.* says {want} "
                "(dp_size x batch_size x accumulation_steps): set them as the trainer's"
            )
        limit = self.o.peer_timeout_s
        if limit:
            quiet = F.silent_for(self.folder / F.CONSUMER_ALIVE)
            quiet = now - self._t0 if quiet is None else quiet
            if quiet > limit:
                raise Stop(
                    f"the trainer has not been heard from in {quiet:.0f} s "
                    f"(online.peer_timeout_s={limit}): capture stops; restart the trainer "
                    "(training.resume_from=its last checkpoint), then this command, to resume"
                )

    # ------------------------------------------------------------------ publishing
    def _publish_loop(self) -> None:
        while not self._stop.is_set():
            try:
                F.beat(self.folder / F.PRODUCER_ALIVE)
                self.publish()
            except BaseException as e:  # noqa: BLE001 - handed to the capture's next check
                log.error("online: publishing failed: %s", e)
                self._error = e
                return
            self._stop.wait(0.02)

    def publish(self) -> int:
        """Append the refs of every sample committed since the last call, in the epochs'
        orders (a sample committed early waits for those before it)."""
        with self.lock:
            self.book.refresh()
            for name in [n for n in self.admitted if n in self.book.shard_of]:
                del self.admitted[name]
            skipped = self.book.skipped
            for name in [n for n in self.admitted if n in skipped]:
                del self.admitted[name]
            lines = []
            for e in sorted(self.order):
                order, p = self.order[e], self.pos[e]
                while p < len(order):
                    name = F.sample_id(e, order[p])
                    if name in self.published or name in skipped:
                        p += 1
                        continue
                    where = self.book.shard_of.get(name)
                    if where is None:
                        break
                    rel = where[0].relative_to(F.epoch_dir(self.folder, e)).as_posix()
                    n = self.book.length_of[name]
                    ref = F.ref_dict(
                        self.o.kind, e, order[p], rel, n, self._trainer_bytes(n),
                        self.cfg.model.path,
                    )  # fmt: skip
                    lines.append(json.dumps(ref, separators=(",", ":")))
                    self.published.add(name)
                    p += 1
                self.pos[e] = p
            F.append_lines(F.refs_path(self.folder), lines)
            self.stats["samples_published"] += len(lines)
            return len(lines)

    def _epoch_done(self, e: int) -> bool:
        return self.pos.get(e, 0) >= len(self.order.get(e, ()))

    def _trainer_bytes(self, tokens: int) -> int:
        """What the trainer holds of the sample (its tensors, bf16 states): estimated_bytes."""
        p = self.plan_doc
        width = len(p["pick"]) * self.writer.hidden
        extra = self.writer.hidden if p["final"] else 0
        return tokens * (16 + 2 * (width + extra))

    def _drain(self, e: int) -> None:
        """Epoch `e`'s capture returned: its writer is closed, so every sample is committed or
        skipped; publish what is left of it now."""
        self.check_peers(every_s=0.0)
        self.publish()
        if not self._epoch_done(e):
            left = len(self.order[e]) - self.pos[e]
            raise Refusal(
                f"epoch {e}: {left} samples are neither committed nor skipped; run the same "
                "command again to capture them"
            )

    def _await_trainer(self) -> str:
        """After .closed: wait for the trainer's end (done, failed or silent)."""
        while True:
            try:
                self.check_peers(every_s=0.0)
            except Stop as e:
                if e.clean:
                    return "trainer done"
                raise
            time.sleep(0.1)

    def _cleanup(self) -> int:
        """The trainer is done: the samples it never trained (SpecForge drops a tail shorter
        than one optimizer window, and stops at its steps) are deleted with their shards."""
        with self.lock:
            self.book.refresh()
            self.book.read_acks()
            left = [n for n in self.published if n not in self.book.acked]
            for path, _ in self.book.resident():
                self.book.drop(path)
        return len(left)


class DiskGate:
    """hsdump.capture.base.Gate of a producer: see the module's docstring."""

    def __init__(self, producer: Producer):
        self.p = producer

    async def wait(self, request) -> None:
        p, t0 = self.p, None
        while True:
            p.check_peers()
            if p.engine is not None and p.engine.stop_requested:
                return
            with p.lock:
                if p.admit(request):
                    break
            if t0 is None:
                t0 = time.perf_counter()
                p.stats["gated"] += 1
            if p.writer is not None and p.writer.pending_ids:
                p.writer.flush()  # what it holds goes to disk and to the trainer
            await asyncio.sleep(0.01)
        if t0 is not None:
            p.stats["gate_wait_s"] += time.perf_counter() - t0


def run(cfg, resolved_config: Optional[dict] = None) -> dict:
    """`python extract.py online=specforge online.folder=DIR ...`: the whole run."""
    return Producer(cfg, resolved_config).run()
