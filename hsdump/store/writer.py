"""Sharded safetensors writer with atomic commits (docs/format.md, format version 2).

A shard is streamed from tensor memory (hashed as it is written) under a temporary name in
its folder, fsynced and renamed; then one record naming it, its checksum and its samples is
appended to this writer's commit log (`commits.CommitLog`) and fsynced. A sample is in the
dataset iff a complete record lists it; killing the process at any instant leaves a valid,
resumable dataset. A commit costs the same at the first shard and at the millionth, and
writers (jobs) sharing one folder never wait on each other while committing. `threads`
background threads write shards while the next one fills, so at most threads + 2 shards are
held in memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from hsdump import __version__
from hsdump.errors import Refusal
from hsdump.store import commits, fp8
from hsdump.store import manifest as manifest_file
from hsdump.store.files import atomic_file, fault, fsync_dir, make_dirs, real_file
from hsdump.store.layout import (
    FINAL_CHECK,
    FORMAT,
    INDEX,
    LOCK,
    LOG_DIR,
    MANIFEST,
    SHARD_BYTES,
    SHARD_DIR,
    SHARD_V1_RE,
    SIDE_FILES,
    VERSION,
    WRITER_THREADS,
    read_header,
    st_code,
    torch_dtype,
)
from hsdump.store.manifest import Manifest

log = logging.getLogger(__name__)


__all__ = ["DatasetWriter", "SampleError", "WriteError", "write_safetensors", "check_sample"]


class SampleError(Refusal):
    """A captured sample that must not be committed (wrong shape, NaN/Inf)."""


class WriteError(RuntimeError):
    """Writing a shard or the index failed (disk full, I/O error)."""


def write_safetensors(
    path: Path, tensors: Dict[str, torch.Tensor], metadata: Dict[str, str], fault_point: str = ""
) -> Tuple[int, str]:
    """Stream `tensors` into a safetensors file at `path` (temporary name, fsync, rename) and
    return (bytes, sha256). The tensors are written straight from their memory and hashed as
    they go: no serialized copy of the shard is ever built."""
    entries, offset = {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        entries[name] = {
            "dtype": st_code(t.dtype),
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    header = json.dumps({"__metadata__": metadata, **entries}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the format aligns the data to 8 bytes
    digest = hashlib.sha256()
    with atomic_file(path, fault_point) as f:
        for chunk in (len(header).to_bytes(8, "little"), header):
            f.write(chunk)
            digest.update(chunk)
        for t in tensors.values():
            buf = memoryview(t.reshape(-1).view(torch.uint8).numpy())
            f.write(buf)  # both release the GIL: other shards proceed meanwhile
            digest.update(buf)
    return 8 + len(header) + offset, digest.hexdigest()


def check_sample(
    sid: int,
    input_ids: Sequence[int],
    loss_mask: Sequence[int],
    hidden_states: Sequence[torch.Tensor],
    hidden_size: int,
    k: int,
    final: Optional[Dict[str, torch.Tensor]] = None,
    final_kinds: Sequence[str] = (),
    nonfinite: Optional[Sequence[int]] = None,
) -> Optional[str]:
    """None if the sample may be committed, else the reason (shape problems raise).
    `nonfinite`: indices into hidden_states + final (in final_kinds order) that the producer
    already found to hold NaN/Inf; when given, the values are not scanned again here."""
    n = len(input_ids)
    if len(loss_mask) != n:
        raise SampleError(f"sample {sid}: loss_mask has {len(loss_mask)} entries, input_ids {n}")
    if len(hidden_states) != k:
        raise SampleError(f"sample {sid}: {len(hidden_states)} hidden-state tensors, expected {k}")
    final = final or {}
    if sorted(final) != sorted(final_kinds):
        raise SampleError(
            f"sample {sid}: final states {sorted(final)}, expected {sorted(final_kinds)}"
        )
    named = [(f"hidden_states[{j}]", h) for j, h in enumerate(hidden_states)]
    named += [(f"final/{kind}", final[kind]) for kind in final_kinds]
    for what, h in named:
        if tuple(h.shape) != (n, hidden_size):
            raise SampleError(
                f"sample {sid}: {what} has shape {tuple(h.shape)}, expected ({n}, {hidden_size})"
            )
    if nonfinite is not None:
        if any(not 0 <= j < len(named) for j in nonfinite):
            raise SampleError(
                f"sample {sid}: nonfinite flags {list(nonfinite)} name tensors "
                f"beyond the {len(named)} given"
            )
        return f"nonfinite in {named[min(nonfinite)][0]}" if nonfinite else None
    for what, h in named:
        # one reduction: NaN and +-Inf survive abs().amax(); far cheaper than isfinite().all()
        if h.numel() and not bool(torch.isfinite(h.abs().amax())):
            return f"nonfinite in {what}"
    return None


class DatasetWriter:
    """Several writers (jobs) may share one folder: each passes its own `writer_tag` and owns
    its commit log and its shard folder, so names never collide and commits never wait on
    another job. Opening and closing take the folder's lock (`.lock`) briefly: to create or
    check manifest.json, and to compact index.json when the writer closes."""

    def __init__(
        self,
        out_dir: str,
        manifest: Manifest,
        *,
        shard_bytes: int = SHARD_BYTES,
        overwrite: bool = False,
        on_nonfinite: str = "raise",
        writer_tag: str = "",
        threads: int = WRITER_THREADS,
    ):
        if not isinstance(manifest, Manifest):
            raise TypeError(
                f"DatasetWriter takes a hsdump.store.manifest.Manifest, not "
                f"{type(manifest).__name__} (Manifest.for_rows(...) for rows of no dataset source)"
            )
        manifest.check()
        self.dir = Path(out_dir)
        self.tag = writer_tag
        self.manifest = manifest
        self.final = list(manifest.final)
        self.fp8 = fp8.is_fp8(manifest.storage_dtype)
        self.layers = list(manifest.layers)
        self.hidden = manifest.model.hidden_size
        self.dtype = torch_dtype(manifest.storage_dtype)
        self.shard_bytes = shard_bytes
        self.on_nonfinite = on_nonfinite
        self.dir.mkdir(parents=True, exist_ok=True)
        with commits.dataset_lock(self.dir):
            self._open(manifest, overwrite)
        self.log = commits.CommitLog(self.dir, self.tag)
        try:
            state = commits.load(self.dir)
        except BaseException:
            self.log.close()
            raise
        self.committed = state.sample_ids()
        self._skipped = set(state.skipped)  # ids refused before and in this run
        nums = [commits.shard_seq(n) for n in state.writer_shards(self.tag)]
        self._next = max([n for n in nums if n is not None], default=-1) + 1
        if state.ids:
            log.info("resuming %s: %d samples committed", self.dir, len(state))
        self._pending: Dict[str, torch.Tensor] = {}
        self._pending_ids: List[int] = []
        self._pending_lens: List[int] = []
        self._pending_masked: List[int] = []
        self._pending_convs: Dict[str, list] = {}
        self._pending_bytes = 0
        self._shard_bytes_held = 0  # shards queued or being written (their tensors' bytes)
        self.peak_host_bytes = 0  # the most row bytes this writer held at once
        self._lock = threading.Lock()  # guards the log, self.committed and the stats
        self.bytes_written = 0
        self.samples_written = 0
        self.shards_written = 0
        self.skipped: Dict[str, int] = {}
        # seconds spent: in add() (caller's thread), of it blocked on a full shard queue, and
        # committing shards (summed over the writer threads): the benchmark's profile
        self.timing = {"add_s": 0.0, "queue_wait_s": 0.0, "commit_s": 0.0}
        self._error: Optional[BaseException] = None
        self._closed = False
        # `threads` shards are written at once (their hashing and writing overlap); with one
        # queued and one filling, at most threads + 2 shards are held in memory
        self._q: "queue.Queue" = queue.Queue(maxsize=1)
        self._threads = [
            threading.Thread(target=self._loop, name=f"hsdump-writer-{i}", daemon=True)
            for i in range(max(1, threads))
        ]
        for t in self._threads:
            t.start()

    # -------------------------------------------------------------- open / resume
    def _compact(self) -> None:
        """Rewrite index.json unless another job is doing so right now (then its index, or
        a later job's, covers what it read; readers read the logs' tails past that anyway, and
        `hsdump compact OUT` compacts once all jobs are done). Many jobs ending together so
        never queue behind each other's compaction."""
        if commits.compact_locked(self.dir, wait=False) is None:
            log.info("another job is compacting %s/index.json; skipped", self.dir)

    def _open(self, manifest: Manifest, overwrite: bool) -> None:
        d = self.dir
        if overwrite:
            remove_dataset(d)
        mpath = d / MANIFEST
        if os.path.lexists(mpath):
            old = commits.read_manifest(d)  # a regular file inside d, or a ValueError
            diff = manifest.resume_key.diff(old.get("resume_key"))
            if diff:
                raise Refusal(
                    f"{d} holds a dataset made with a different config; it cannot resume:\n  "
                    + "\n  ".join(diff)
                    + "\nUse another output.dir, or output.overwrite=true to start over."
                )
            if commits.version_of(d) == 1:
                upgrade_v1(d, old)
                old = {**old, "format_version": VERSION}
            # a resumed run that plans more or fewer samples (another dataset.max_samples)
            manifest_file.replan(d, old, manifest.planned)
            return
        stray = [
            p.name
            for p in d.iterdir()
            if not SHARD_V1_RE.match(p.name)
            and p.name not in (LOCK, LOG_DIR, SHARD_DIR, FINAL_CHECK) + SIDE_FILES
        ]
        if stray:
            raise Refusal(
                f"output.dir={d} is not empty and holds no hsdump dataset "
                f"({', '.join(sorted(stray)[:5])}); choose an empty or new folder"
            )
        # a valid, empty dataset from the first instant: no index.json yet, no log
        manifest_file.write(d, manifest)

    def skip(self, sid: int, reason: str, count_as: Optional[str] = None) -> None:
        """Record that sample `sid` is left out (NaN/Inf, or a regenerated conversation too
        long): a resumed run does not make it again. Durable with the next commit's fsync (or
        close); a crash that loses it only makes the sample again, and refused again. Counted
        in `skipped` under `count_as` (default: the reason)."""
        if self._closed:
            raise RuntimeError(f"the writer of {self.dir} is closed")
        key = count_as or reason
        with self._lock:
            self.log.append({"skipped": {str(sid): reason}}, sync=False)
            self._skipped.add(sid)
            self.skipped[key] = self.skipped.get(key, 0) + 1

    def done_ids(self) -> set:
        """Sample ids this dataset already holds or refused (committed or recorded as
        skipped): a resumed run does not submit them again."""
        with self._lock:
            return self.committed | self._skipped

    # -------------------------------------------------------------- adding samples
    def add(
        self,
        sid: int,
        input_ids: Sequence[int],
        loss_mask: Sequence[int],
        hidden_states: Sequence[torch.Tensor],
        final: Optional[Dict[str, torch.Tensor]] = None,
        nonfinite: Optional[Sequence[int]] = None,
        conversation: Optional[list] = None,
    ) -> bool:
        """Validate and stage one sample; returns False if it was skipped (NaN/Inf, skip policy).
        `final` maps each configured final-state kind to its [seq, H] tensor. `nonfinite`: the
        indices into hidden_states + final (in the writer's `final` order) that the producer
        found to hold NaN/Inf, e.g. CaptureEngine's device-side check; None scans the values
        here (one reduction per tensor on the CPU). `conversation`: the messages the sample was
        made from when the target model regenerated its answers; stored in the shard's metadata
        (`conversations`), so it is committed with the sample."""
        t0 = time.perf_counter()
        try:
            return self._add(
                sid, input_ids, loss_mask, hidden_states, final, nonfinite, conversation
            )
        finally:
            self.timing["add_s"] += time.perf_counter() - t0

    def add_sample(self, s) -> bool:
        """`add` of an engine's hsdump.capture.base.CapturedSample (its ids, loss mask, layer
        rows, final states, device-found NaN/Inf indices and conversation)."""
        if s.loss_mask is None:
            raise ValueError(
                f"sample {s.sid}: no loss mask: build its Request with the sample's loss_mask"
            )
        return self.add(
            s.sid, s.input_ids, s.loss_mask, s.layers, s.final, s.nonfinite, s.conversation
        )

    def _add(
        self, sid, input_ids, loss_mask, hidden_states, final, nonfinite, conversation=None
    ) -> bool:
        if self._error is not None:
            self.close(commit=False)  # a failed writer is finished: threads and log released
            self._raise_if_failed()
        if self._closed:
            raise RuntimeError(f"the writer of {self.dir} is closed")
        # stored from contiguous memory (CaptureEngine's rows already are: no copy then);
        # converted only if the storage dtype differs
        hidden_states = [h.contiguous() for h in hidden_states]
        final = {k: v.contiguous() for k, v in (final or {}).items()}
        reason = check_sample(
            sid,
            input_ids,
            loss_mask,
            hidden_states,
            self.hidden,
            len(self.layers),
            final,
            self.final,
            nonfinite,
        )
        if reason is not None:
            if self.on_nonfinite == "raise":
                raise SampleError(
                    f"sample {sid}: {reason} (output.on_nonfinite=skip records and "
                    "skips such samples)"
                )
            self.skip(sid, reason, "nonfinite")
            return False
        t = {
            f"{sid}/input_ids": torch.as_tensor(input_ids, dtype=torch.int64),
            f"{sid}/loss_mask": torch.as_tensor(loss_mask, dtype=torch.int64),
        }
        states = [(f"{sid}/hidden_states/{j}", h) for j, h in enumerate(hidden_states)]
        states += [(f"{sid}/final/{kind}", final[kind]) for kind in self.final]
        for name, h in states:
            # fp8 is encoded by the writer threads (_encode), off the caller's thread: there
            # it cost 140-170 ms per 2,048-token sample on the H200 host, in the thread that
            # feeds the engine (docs/performance.md, "Capture throughput, one H200"). A shard is held unencoded until then,
            # so its flush threshold counts the unencoded bytes (the host budget holds).
            t[name] = h if self.fp8 else h.to(self.dtype)  # no copy when the dtype matches
        nbytes = sum(x.numel() * x.element_size() for x in t.values())
        if self._pending_bytes and self._pending_bytes + nbytes > self.shard_bytes:
            self._flush()  # a shard holds at most max(shard_bytes, one sample) bytes
        self._pending.update(t)
        self._pending_ids.append(sid)
        if conversation is not None:
            self._pending_convs[str(sid)] = conversation
        self._pending_lens.append(len(input_ids))
        self._pending_masked.append(int(t[f"{sid}/loss_mask"].sum()))
        self._pending_bytes += nbytes
        self.peak_host_bytes = max(self.peak_host_bytes, self.host_bytes)
        if self._pending_bytes >= self.shard_bytes:
            self._flush()
        return True

    @property
    def host_bytes(self) -> int:
        """Bytes of sample tensors this writer holds now: the shard filling, the one queued
        and those being written; at most (writer_threads + 2) x max(shard_bytes, one sample)."""
        return self._pending_bytes + self._shard_bytes_held

    @property
    def pending_ids(self) -> List[int]:
        """The samples of the shard filling now (not yet handed to the writer threads)."""
        return list(self._pending_ids)

    def flush(self) -> None:
        """Hand the shard filling now to the writer threads, however small (hsdump.online: a
        capture held back by its disk cap commits what it holds, so the trainer can go on).
        From the thread that calls add()."""
        self._raise_if_failed()
        self._flush()

    def _flush(self) -> None:
        if not self._pending_ids:
            return
        name = commits.shard_name(self.tag, self._next)
        self._next += 1
        t0 = time.perf_counter()
        with self._lock:
            self._shard_bytes_held += self._pending_bytes
        self._q.put(
            (
                self._pending_bytes,
                name,
                self._pending,
                self._pending_ids,
                self._pending_lens,
                self._pending_masked,
                self._pending_convs,
            )
        )
        self.timing["queue_wait_s"] += time.perf_counter() - t0
        self._pending, self._pending_ids, self._pending_bytes = {}, [], 0
        self._pending_lens, self._pending_masked, self._pending_convs = [], [], {}

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            nbytes, item = item[0], item[1:]
            if self._error is None:
                t0 = time.perf_counter()
                try:
                    self._commit(*item)
                    with self._lock:
                        self.timing["commit_s"] += time.perf_counter() - t0
                except BaseException as e:  # reported on the next add()/close()
                    self._error = e
                    log.error("writing %s to %s failed: %s", item[0], self.dir, e)
            item = None  # the shard's tensors are freed here, before it is counted out
            with self._lock:
                self._shard_bytes_held -= nbytes
            self._q.task_done()

    def _commit(
        self,
        name: str,
        tensors: Dict[str, torch.Tensor],
        ids: List[int],
        lengths: List[int],
        masked: List[int],
        convs: Dict[str, list],
    ) -> None:
        meta = {
            "format": FORMAT,
            "format_version": str(VERSION),
            "layers": json.dumps(self.layers),
            "convention": "hf_hidden_states_index",
            "final": json.dumps(self.final),
            "hsdump_version": __version__,
            "storage_dtype": str(self.dtype).split(".")[-1],
        }
        if self.fp8:
            meta.update(fp8.shard_metadata())
        if convs:
            meta["conversations"] = json.dumps(convs, ensure_ascii=False)
        path = self.dir / name
        make_dirs(path.parent)
        if self.fp8:
            tensors = self._encode(tensors)
        nbytes, digest = write_safetensors(path, tensors, meta, fault_point="before_rename")
        fault("before_record")
        rec = {
            "shard": name,
            "bytes": nbytes,
            "sha256": digest,
            "ids": ids,
            "lengths": lengths,
            "masked": masked,
        }
        with self._lock:
            self.log.append(rec)  # the commit: the shard is in the dataset from here on
            self.committed.update(ids)
            self.bytes_written += nbytes
            self.samples_written += len(ids)
            self.shards_written += 1

    @staticmethod
    def _encode(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """fp8 storage: each hidden or final state -> e4m3 values + float32 per-token scales
        (`name`, `name/scale`); ids and masks as they are."""
        out: Dict[str, torch.Tensor] = {}
        for name, t in tensors.items():
            if "/hidden_states/" in name or "/final/" in name:
                out.update(fp8.encode(name, t))
            else:
                out[name] = t
        return out

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise WriteError(
                f"writing to output.dir={self.dir} failed: {self._error}. Samples committed "
                "before are intact; fix the cause (e.g. free disk space) and run the same "
                "command again to resume."
            ) from self._error

    def close(self, commit: bool = True) -> None:
        """Commit what is staged (unless `commit` is False), wait for the writer threads,
        then compact index.json. Raises WriteError if a write failed; a second call does
        nothing."""
        if self._closed:
            return
        self._closed = True
        if commit and self._error is None:
            self._flush()
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            t.join()
        try:
            if self._error is None:
                self.log.sync()  # skipped records appended since the last commit
            if commit and self._error is None:
                self._compact()
        finally:
            self.log.close()
        self._raise_if_failed()


def remove_dataset(d: Path) -> None:
    """output.overwrite=true: delete what a dataset consists of (and nothing else) so the
    folder can take a new one."""
    for p in list(d.iterdir()):
        n = p.name
        if (
            n in (MANIFEST, INDEX) + SIDE_FILES
            or SHARD_V1_RE.match(n)
            or n.startswith(tuple(f + ".tmp" for f in (MANIFEST, INDEX) + SIDE_FILES))
        ):
            p.unlink()
        elif n in (LOG_DIR, SHARD_DIR, FINAL_CHECK) and p.is_dir():
            shutil.rmtree(p)
    fsync_dir(d)


def upgrade_v1(d: Path, manifest: dict) -> None:
    """Resume a version 1 dataset as version 2: its index becomes a version 2 index (shards
    keep their names; lengths from their headers), written before the manifest's version
    changes, so a crash at any instant leaves a readable dataset."""

    c = commits.load(d)
    log.info("%s: format version 1, upgraded to version 2 to resume (%d samples)", d, len(c))
    from safetensors import safe_open

    v2 = commits.Commits(version=VERSION, skipped=dict(c.skipped))
    for name, meta in c.shards.items():
        head, _ = read_header(d / name, d)  # checked whole, inside the folder
        ids = sorted(meta["ids"])
        with safe_open(real_file(d / name, d), framework="pt") as f:
            masked = [int(f.get_tensor(f"{i}/loss_mask").sum()) for i in ids]
        v2._add_shard(
            {
                "shard": name,
                "bytes": meta["bytes"],
                "sha256": meta["sha256"],
                "ids": ids,
                "lengths": [head[f"{i}/input_ids"]["shape"][0] for i in ids],
                "masked": masked,
            },
            INDEX,
        )
    commits.write_index(d, v2.finish())
    manifest_file.upgrade(d, manifest, VERSION)
