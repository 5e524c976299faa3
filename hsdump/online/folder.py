"""The shared folder of a train-while-capturing run: its layout, the ref lines, the side files.

    FOLDER/
      online.json                 the producer's plan (kind, layers, final state, epochs, seed,
                                  the trainer's quantum, the cap): the store reads it
      token_freq.json             EAGLE-3 only: the fed samples' loss-masked token counts, for
                                  its vocabulary map (hsdump.online.vocab)
      control/refs.jsonl          SpecForge's ref channel: one SampleRef (JSON) per line,
                                  appended by the producer in each epoch's order
      control/refs.jsonl.*        SpecForge's side files (.closed, .failed, .consumed_count,
                                  .consumer_quantum, .consumer_done, .consumer_failed,
                                  .schedule.json); control/consumer.sqlite, control/inboxes/
      control/producer.alive, control/consumer.alive   heartbeats (mtime), once a second
      store/epoch{e:04d}/         epoch e's hsdump dataset (docs/format.md), shards deleted by
                                  the trainer once every sample in them is acknowledged
      store/acks.jsonl            the acknowledged sample ids, one JSON string a line

A sample's id is `hsdump-e{epoch:04d}-{id:012d}`: new every epoch, as SpecForge's own producer
mints `epoch{e:04d}-prompt{i:012d}` (its ledger keeps each id once). Nothing here imports torch
or SpecForge: both sides share it.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

RUN_ID = "hsdump"
PLAN = "online.json"
REFS = "control/refs.jsonl"
DB = "control/consumer.sqlite"
INBOXES = "control/inboxes"
STORE = "store"
ACKS = "store/acks.jsonl"
PRODUCER_ALIVE = "control/producer.alive"
CONSUMER_ALIVE = "control/consumer.alive"
# SpecForge 0.2.0's side files of the ref channel (streaming_ref_channel.py, disaggregated.py)
CLOSED, FAILED, CONSUMED = ".closed", ".failed", ".consumed_count"
QUANTUM, DONE, CONSUMER_FAILED = ".consumer_quantum", ".consumer_done", ".consumer_failed"
SCHEDULE = ".schedule.json"

KEYS = {
    "dflash": ("input_ids", "loss_mask", "hidden_states"),
    "domino": ("input_ids", "loss_mask", "hidden_states"),
    "dspark": ("input_ids", "loss_mask", "hidden_states", "target_last_hidden_states"),
    "eagle3": ("attention_mask", "loss_mask", "target", "hidden_state", "input_ids"),
}
"""The tensors SpecForge 0.2.0's online consumer reads per kind (its server_streaming layouts;
the offline normalizers' outputs, which the store applies)."""
TARGET_REPR = {"dflash": None, "domino": None, "dspark": "hidden_state", "eagle3": "hidden_state"}
"""Each kind's ref metadata `target_repr` (server_streaming target_representation)."""

_SID = re.compile(r"^hsdump-e(\d{4,})-(\d{12,})$")


def refs_path(folder) -> Path:
    return Path(folder) / REFS


def epoch_dir(folder, epoch: int) -> Path:
    return Path(folder) / STORE / f"epoch{epoch:04d}"


def sample_id(epoch: int, sid: int) -> str:
    return f"hsdump-e{epoch:04d}-{sid:012d}"


def parse_sample_id(name: str) -> Tuple[int, int]:
    m = _SID.match(name)
    if not m:
        raise KeyError(f"{name!r} is not an hsdump online sample id (hsdump-eNNNN-NNNNNNNNNNNN)")
    return int(m.group(1)), int(m.group(2))


def trainer_keeps(kind: str, loss_mask: Iterable[int]) -> bool:
    """Whether SpecForge trains on a sample of this loss mask: the DFlash family needs two
    consecutive supervised tokens (has_consecutive_supervised_tokens, its loss_mask_filter;
    its offline normalizer refuses the others), EAGLE-3 one supervised token before the last
    position (its normalizer zeroes the last)."""
    m = [int(x) for x in loss_mask]
    if kind == "eagle3":
        return any(m[:-1])
    return any(a and b for a, b in zip(m, m[1:]))


def ref_dict(
    kind: str,
    epoch: int,
    sid: int,
    shard: str,
    num_tokens: int,
    nbytes: int,
    target_model: str = "unknown",
) -> dict:
    """One SampleRef as SpecForge's ref_to_dict writes it (dataclasses.asdict: every field, in
    its order); the features are named, not specified (specs are optional for the loader)."""
    return {
        "sample_id": sample_id(epoch, sid),
        "run_id": RUN_ID,
        "source_task_id": None,
        "feature_store_uri": f"hsdump://epoch{epoch:04d}/{shard}#{sid}",
        "feature_keys": {k: k for k in KEYS[kind]},
        "feature_specs": {},
        "strategy": kind,
        "schema_version": 1,
        "target_model_version": target_model,
        "draft_weight_version": None,
        "tokenizer_version": "unknown",
        "num_tokens": int(num_tokens),
        "estimated_bytes": int(nbytes),
        "metadata": {
            "target_repr": TARGET_REPR[kind],
            "generation": 1,
            "epoch": epoch,
            "hsdump_id": sid,
            "shard": shard,
        },
    }


def append_lines(path: Path, lines: List[str]) -> None:
    """Whole lines appended with one O_APPEND write and fsynced (StreamingRefChannel's way)."""
    if not lines:
        return
    payload = "".join(line + "\n" for line in lines).encode()
    fd = os.open(path, os.O_APPEND | os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        view = memoryview(payload)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_lines(path: Path, start: int = 0) -> Tuple[List[str], int]:
    """Complete lines from byte `start` (a torn last line is left for later), and the end."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return [], start
    cut = data.rfind(b"\n") + 1
    lines = [ln for ln in data[:cut].decode().split("\n") if ln.strip()]
    return lines, start + cut


def published_ids(folder) -> List[str]:
    """The sample ids refs.jsonl holds, in order."""
    lines, _ = read_lines(refs_path(folder))
    return [json.loads(ln)["sample_id"] for ln in lines]


def side(folder, suffix: str) -> Optional[str]:
    """A SpecForge side file's text (None: absent)."""
    try:
        return (Path(str(refs_path(folder)) + suffix)).read_text()
    except FileNotFoundError:
        return None


def write_side(folder, suffix: str, text: str) -> None:
    write_atomic(Path(str(refs_path(folder)) + suffix), text)


def total_steps(num_samples: int, epochs: int, quantum: int) -> int:
    """SpecForge's resolve_online_total_steps: whole optimizer windows over every epoch."""
    return (int(num_samples) * int(epochs)) // int(quantum)


def shard_bytes(path) -> int:
    """Bytes of the shard files (and their temporaries) on disk under `path` now: what the
    cap bounds, as a reader of the disk sees it (files that vanish while counted are skipped)."""
    total = 0
    for root, _, names in os.walk(path):
        for n in names:
            if ".safetensors" in n:
                try:
                    total += os.stat(os.path.join(root, n)).st_size
                except FileNotFoundError:
                    pass
    return total


def beat(path: Path) -> None:
    """A heartbeat: the file's mtime is now."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a"):
        os.utime(path)


def silent_for(path: Path) -> Optional[float]:
    """Seconds since the heartbeat `path` last beat (None: it never beat)."""
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except FileNotFoundError:
        return None


class ShardBook:
    """Which shard holds each sample and which samples the trainer has acknowledged, read from
    the epochs' commit logs and store/acks.jsonl as they grow (each read from where it
    stopped). `ack(ids)` appends the ids, then deletes every shard all of whose samples are
    acknowledged: whichever process appends last sees every earlier line, so a shard whose
    samples several ranks acknowledge is deleted by one of them."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.shard_of: Dict[str, Tuple[Path, int]] = {}  # sample id -> (shard file, bytes)
        self.ids_of: Dict[Path, List[str]] = {}
        self.length_of: Dict[str, int] = {}
        self.skipped: Set[str] = set()  # the commit logs' skipped records
        self.acked: Set[str] = set()
        self._logs: Dict[Path, int] = {}
        self._acks_at = 0

    def refresh(self) -> None:
        from hsdump.store.commits import read_log

        root = self.folder / STORE
        for d in sorted(root.glob("epoch*")) if root.is_dir() else ():
            m = re.match(r"^epoch(\d+)$", d.name)
            if not m:
                continue
            epoch = int(m.group(1))
            for log in sorted((d / "commits").glob("*.jsonl")):
                recs, end, _, _ = read_log(log, self._logs.get(log, 0), root=d)
                self._logs[log] = end
                for _, rec in recs:
                    if isinstance(rec, dict) and "shard" in rec:
                        path = d / rec["shard"]
                        names = [sample_id(epoch, int(i)) for i in rec["ids"]]
                        self.ids_of[path] = names
                        for n, length in zip(names, rec["lengths"]):
                            self.shard_of[n] = (path, int(rec["bytes"]))
                            self.length_of[n] = int(length)
                    elif isinstance(rec, dict) and isinstance(rec.get("skipped"), dict):
                        self.skipped.update(sample_id(epoch, int(i)) for i in rec["skipped"])

    def read_acks(self) -> List[str]:
        lines, self._acks_at = read_lines(self.folder / ACKS, self._acks_at)
        new = [json.loads(ln) for ln in lines]
        self.acked.update(new)
        return new

    def ack(self, ids: List[str]) -> int:
        """Record `ids` as acknowledged and delete the shards now wholly acknowledged; returns
        the bytes freed."""
        seen = self.read_acks()
        # SpecForge's resumed consumer acknowledges again what its ledger had: each id is
        # written once (ranks acknowledging at the same time may still both write one)
        fresh = list(dict.fromkeys(i for i in ids if i not in self.acked))
        if fresh:
            append_lines(self.folder / ACKS, [json.dumps(i) for i in fresh])
        new = seen + self.read_acks() + [i for i in ids if i not in fresh]
        if any(n not in self.shard_of for n in new):
            self.refresh()
        freed = 0
        for path in {self.shard_of[n][0] for n in new if n in self.shard_of}:
            if all(i in self.acked for i in self.ids_of[path]):
                freed += self.drop(path)
        return freed

    def drop(self, path: Path) -> int:
        try:
            size = path.stat().st_size
            path.unlink()
            return size
        except FileNotFoundError:
            return 0

    def resident(self) -> List[Tuple[Path, int]]:
        """The committed shards still on disk, with their bytes."""
        return [(p, self.shard_of[ids[0]][1]) for p, ids in self.ids_of.items() if p.exists()]
