"""Which shards and samples a dataset holds: per-writer commit logs and a compact index.

Format version 2 (docs/format.md). Each writer (one per job) appends one JSON line per
committed shard to its own log, `commits/<tag>.jsonl`, and fsyncs it: a shard is in the
dataset if and only if its line is complete (ends with a newline). A torn last line (a crash in
the middle of the append) is ignored by readers and cut off by the writer that resumes the log.
The dataset is the union of the logs. `index.json`, rewritten when a writer closes, holds the
same records compacted plus, per log, the byte offset up to which it covers it, so opening a
dataset parses one JSON file and the logs' tails. Committing a shard costs one append whatever
the dataset's size, and no lock is shared by writers while they commit.

A version 1 dataset (one `index.json` listing every sample) is read as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
from array import array
from collections.abc import Mapping
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from hsdump.errors import MissingInput, Refusal
from hsdump.store.files import (
    UnsafeFile,
    atomic_file,
    fault,
    fsync_dir,
    make_dirs,
    parse_json,
    read_inside,
    read_json_object,
    real_file,
)
from hsdump.store.layout import (
    FORMAT,
    ID_LIMIT,
    INDEX,
    LINE_LIMIT,
    LOCK,
    LOG_DIR,
    LOG_SUFFIX,
    MANIFEST,
    MANIFEST_LIMIT,
    PER_DIR,
    SHARD_DIR,
    SHARD_SEQ_RE,
    SUPPORTED_VERSIONS,
    VERSION,
)


def writer_name(tag: str) -> str:
    return tag or "main"


def log_path(d: Path, tag: str) -> Path:
    return Path(d) / LOG_DIR / (writer_name(tag) + LOG_SUFFIX)


def shard_name(tag: str, seq: int) -> str:
    """The path, relative to the dataset folder, of writer `tag`'s shard number `seq`."""
    w = writer_name(tag)
    return f"{SHARD_DIR}/{w}/{seq // PER_DIR:04d}/{w}-{seq:06d}.safetensors"


def shard_seq(name: str) -> Optional[int]:
    m = SHARD_SEQ_RE.search(name)
    return int(m.group(1)) if m else None


def safe_relpath(name) -> bool:
    """A shard path that stays inside the dataset folder."""
    if not isinstance(name, str) or not name.endswith(".safetensors") or "\\" in name:
        return False
    parts = name.split("/")
    return not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


class Commits:
    """What a dataset holds, as its index and logs say, kept in columns (a 1M-sample dataset
    is a few flat arrays, not a million objects).

    Per shard k: `names[k]`, `nbytes[k]`, `sha256[k]`, and its samples at positions
    `starts[k] .. starts[k + 1]` of the per-sample columns `ids`, `lens`, `masked` (`lens` and
    `masked` are None for a version 1 dataset, whose records carry neither)."""

    def __init__(self, version: int, skipped: Optional[Dict[int, str]] = None):
        self.version = version
        self.names: List[str] = []
        self.nbytes: List[int] = []
        self.sha256: List[str] = []
        self.starts: List[int] = [0]
        self.ids: List[int] = []
        self.lens: Optional[List[int]] = [] if version >= 2 else None
        self.masked_counts: Optional[List[int]] = [] if version >= 2 else None
        self.skipped: Dict[int, str] = dict(skipped or {})
        """sample id -> why the writer refused it (NaN/Inf)."""
        self.covers: Dict[str, int] = {}
        """log name -> byte offset up to which its complete records were read."""
        self.torn: Dict[str, int] = {}
        """log name -> bytes of an incomplete last record that was ignored."""
        self.problems: List[Tuple[str, str]] = []
        """(where, what): records that are malformed, duplicated, or contradict each other."""
        self.notes: List[Tuple[str, str]] = []
        """(where, what): damage that loses nothing (an index.json that does not parse, whose
        records the logs hold): a warning for readers, a problem for verify."""
        self._names: set = set()
        self.first: Optional[List[bool]] = None
        """Per sample position: False for a repeat of an id listed earlier (None: no repeat)."""

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return len(self.ids) if self.first is None else sum(self.first)

    @property
    def shards(self) -> Dict[str, dict]:
        """name -> {"bytes", "sha256", "ids", and in version 2 "lengths", "masked"} (built on
        each call: for verify and tests, not for the reader's hot path)."""
        out = {}
        for k, name in enumerate(self.names):
            a, b = self.starts[k], self.starts[k + 1]
            meta = {"bytes": self.nbytes[k], "sha256": self.sha256[k], "ids": list(self.ids[a:b])}
            if self.lens is not None:
                meta["lengths"] = list(self.lens[a:b])
                meta["masked"] = list(self.masked_counts[a:b])
            out[name] = meta
        return out

    @property
    def samples(self) -> Dict[int, str]:
        """sample id -> the name of the (first) shard that holds it."""
        out: Dict[int, str] = {}
        for k, name in enumerate(self.names):
            for sid in self.ids[self.starts[k] : self.starts[k + 1]]:
                out.setdefault(sid, name)
        return out

    def sample_ids(self) -> set:
        return set(self.ids)

    def refused(self) -> int:
        """How many samples the writers refused (skipped records) and no record commits."""
        if not self.skipped:
            return 0
        skipped = np.fromiter(self.skipped, dtype=np.int64, count=len(self.skipped))
        return int((~np.isin(skipped, np.asarray(self.ids, dtype=np.int64))).sum())

    def writer_shards(self, tag: str) -> List[str]:
        prefix = f"{SHARD_DIR}/{writer_name(tag)}/"
        return [n for n in self.names if n.startswith(prefix)]

    def arrays(self):
        """(sorted unique sample ids, shard index of each, lengths or None, masked or None)
        as numpy arrays: the reader's lookup tables."""

        ids = np.asarray(self.ids, dtype=np.int64)
        count = np.diff(np.asarray(self.starts, dtype=np.int64))
        shard = np.repeat(np.arange(len(self.names), dtype=np.int32), count)
        keep = None if self.first is None else np.asarray(self.first, dtype=bool)
        cols = [ids, shard]
        for col in (self.lens, self.masked_counts):
            cols.append(None if col is None else np.asarray(col, dtype=np.int64))
        if keep is not None:
            cols = [c if c is None else c[keep] for c in cols]
        order = np.argsort(cols[0], kind="stable")
        return tuple(c if c is None else c[order] for c in cols)

    # ------------------------------------------------------------------ building
    def _add_shard(self, rec: dict, where: str) -> None:
        name, ids = rec.get("shard"), rec.get("ids")
        bad = None
        if not safe_relpath(name):
            bad = f"shard path {name!r} is not a .safetensors path inside the dataset folder"
        elif not _ints([rec.get("bytes")]) or not isinstance(rec.get("sha256"), str):
            bad = f"record for {name} has no valid bytes/sha256"
        elif not _ints(ids):
            bad = f"record for {name} has no valid list of sample ids (int64 >= 0)"
        elif self.lens is not None:
            for k in ("lengths", "masked"):
                if not (_ints(rec.get(k)) and len(rec[k]) == len(ids)):
                    bad = f"record for {name} has no {k} list that matches its ids"
        if bad:
            self.problems.append((where, bad))
            return
        if name in self._names:
            self.problems.append((where, f"{name} is committed twice; the first record is used"))
            return
        self._names.add(name)
        self.names.append(name)
        self.nbytes.append(rec["bytes"])
        self.sha256.append(rec["sha256"])
        self.ids.extend(ids)
        if self.lens is not None:
            self.lens.extend(rec["lengths"])
            self.masked_counts.extend(rec["masked"])
        self.starts.append(len(self.ids))

    def _add_record(self, rec, where: str) -> None:
        if isinstance(rec, dict) and "shard" in rec:
            self._add_shard(rec, where)
        elif isinstance(rec, dict) and isinstance(rec.get("skipped"), dict):
            for sid, reason in rec["skipped"].items():
                if id_value(sid) is not None:
                    self.skipped[id_value(sid)] = str(reason)[:1000]
                else:
                    self.problems.append(
                        (where, f"skipped sample id {sid[:40]!r} is not an int64 >= 0")
                    )
        else:
            self.problems.append(
                (where, f"record {str(rec)[:80]!r} is neither a shard nor a skipped record")
            )

    def _add_columns(self, idx: dict) -> bool:
        """The shards and samples of a version 2 index.json, checked as whole columns."""
        sh, sa = idx.get("shards"), idx.get("samples")
        ok = isinstance(sh, dict) and isinstance(sa, dict)
        cols = [sh.get(k) for k in ("path", "bytes", "sha256", "count")] if ok else []
        scols = [sa.get(k) for k in ("id", "length", "masked")] if ok else []
        ok = (
            ok
            and all(isinstance(c, list) for c in cols + scols)
            and len({len(c) for c in cols}) == 1
            and len({len(c) for c in scols}) == 1
            and _ints(cols[1])
            and _ints(cols[3])
            and all(map(_ints, scols))
            and sum(cols[3]) == len(scols[0])
            and min(cols[3], default=0) >= 0
        )
        if not ok:
            self.problems.append(
                (
                    INDEX,
                    "its shards/samples columns are malformed; the commit "
                    "logs are read from their start instead",
                )
            )
            return False
        paths, nbytes, sha, count = cols
        if (
            not all(map(safe_relpath, paths))
            or len(set(paths)) != len(paths)
            or not all(isinstance(h, str) for h in sha)
        ):
            self.problems.append(
                (
                    INDEX,
                    "lists a shard path that is not a .safetensors path "
                    "inside the dataset folder, twice, or without sha256; "
                    "the commit logs are read from their start instead",
                )
            )
            return False
        self.names, self.nbytes, self.sha256 = paths, nbytes, sha
        self._names = set(paths)
        self.starts = list(itertools.accumulate(count, initial=0))
        self.ids, self.lens, self.masked_counts = scols
        return True

    def compact_columns(self) -> None:
        """Per-sample columns as machine integers (8 bytes per entry instead of a Python int
        object each: 1M samples hold ~24 MB here, not ~110 MB)."""
        self.ids = array("q", self.ids)
        self.starts = array("q", self.starts)
        if self.lens is not None:
            self.lens = array("q", self.lens)
            self.masked_counts = array("q", self.masked_counts)

    def finish(self) -> "Commits":
        uniq = set(self.ids)
        if len(uniq) != len(self.ids):  # rare: find each repeat and where
            seen: Dict[int, str] = {}
            first = []
            for k, name in enumerate(self.names):
                for sid in self.ids[self.starts[k] : self.starts[k + 1]]:
                    if sid in seen:
                        first.append(False)
                        self.problems.append(
                            (
                                f"sample {sid}",
                                f"committed in {seen[sid]} and again in {name} (duplicate sample)",
                            )
                        )
                    else:
                        seen[sid] = name
                        first.append(True)
            self.first = first
        both = uniq.intersection(self.skipped)
        for sid in sorted(both):
            self.problems.append(
                (
                    f"sample {sid}",
                    f"listed both as committed and as skipped ({self.skipped[sid]!r})",
                )
            )
        self.compact_columns()
        return self

    def index_lines(self):
        """index.json (version 2) as a stream of text, columns of plain JSON lists."""
        head = {
            "format": FORMAT,
            "format_version": VERSION,
            "covers": self.covers,
            "skipped": {str(k): v for k, v in sorted(self.skipped.items())},
        }
        text = json.dumps(head, separators=(",", ":"), sort_keys=True)
        yield text[:-1] + ',\n"shards":{"path":'
        yield json.dumps(self.names) + ',\n"bytes":' + json.dumps(self.nbytes)
        yield ',\n"sha256":' + json.dumps(self.sha256) + ',\n"count":'
        yield json.dumps([b - a for a, b in zip(self.starts, self.starts[1:])])
        yield '},\n"samples":{"id":' + json.dumps(_plain(self.ids)) + ',\n"length":'
        yield (
            json.dumps(_plain(self.lens))
            + ',\n"masked":'
            + json.dumps(_plain(self.masked_counts))
            + "}}\n"
        )


def _plain(col):
    return col.tolist() if isinstance(col, array) else col


def _ints(x) -> bool:
    """A list of int64 values >= 0 (C loops: ~3x a generator's speed)."""
    return (
        type(x) is list
        and set(map(type, x)) <= _INT
        and (not x or (min(x) >= 0 and max(x) < ID_LIMIT))
    )


def id_value(x) -> Optional[int]:
    """A sample id written as a JSON object key ("12"), or None."""
    if isinstance(x, str) and x.isascii() and x.isdigit() and len(x) < 20 and int(x) < ID_LIMIT:
        return int(x)
    return None


_INT = {int}


# ---------------------------------------------------------------------- reading
def read_log(
    path: Path, start: int = 0, root=None
) -> Tuple[List[Tuple[int, object]], int, int, List[str]]:
    """Complete records of a log from byte `start`: ([(offset, record)], end offset after the
    last complete record, bytes of a torn tail, [lines that do not parse]). `root`: the
    dataset folder the log must lie in (hsdump.store.files.read_inside)."""
    data = read_inside(path, root, limit=ID_LIMIT, start=start)
    cut = data.rfind(b"\n") + 1
    body, torn = data[:cut], len(data) - cut
    if not body:
        return [], start, torn, []
    lines = body[:-1].split(b"\n")
    if max(map(len, lines)) > LINE_LIMIT:  # not a record: reported, never parsed
        out, bad, off = [], [], start
        for ln in lines:
            if len(ln) > LINE_LIMIT:
                bad.append(f"byte {off}: a line of {len(ln):,} bytes, longer than any record")
            else:
                try:
                    out.append((off, json.loads(ln)))
                except (ValueError, RecursionError):
                    bad.append(f"byte {off}: {ln[:60]!r}")
            off += len(ln) + 1
        return out, start + cut, torn, bad
    offsets, off = [], start
    for ln in lines:
        offsets.append(off)
        off += len(ln) + 1
    try:  # one parse for the whole tail: ~3x faster than a json.loads per line
        recs = json.loads(b"[" + b",".join(lines) + b"]")
        if len(recs) == len(lines):
            return list(zip(offsets, recs)), start + cut, torn, []
    except (ValueError, RecursionError):
        pass
    out, bad = [], []
    for o, ln in zip(offsets, lines):
        try:
            out.append((o, json.loads(ln)))
        except (ValueError, RecursionError):
            bad.append(f"byte {o}: {ln[:60]!r}")
    return out, start + cut, torn, bad


def log_names(d: Path) -> List[str]:
    p = Path(d) / LOG_DIR
    if not p.is_dir():
        return []
    return sorted(q.name[: -len(LOG_SUFFIX)] for q in p.iterdir() if q.name.endswith(LOG_SUFFIX))


def version_of(d: Path) -> int:
    """The dataset's format version: index.json's when there is one that reads, else
    manifest.json's."""
    d = Path(d)
    if (d / INDEX).exists():
        try:
            v = read_json_object(d / INDEX, d).get("format_version")
            if v in SUPPORTED_VERSIONS:
                return v
        except UnsafeFile:
            raise
        except ValueError:
            pass  # a corrupt index: the manifest says
    if not os.path.lexists(d / MANIFEST):
        raise MissingInput(f"{d} has no manifest.json: not an hsdump dataset")
    v = read_manifest(d).get("format_version")
    return v if v in SUPPORTED_VERSIONS else 0


def read_manifest(d: Path) -> dict:
    """manifest.json as an object (a regular file inside `d`, at most MANIFEST_LIMIT bytes).
    Raises FileNotFoundError without one, ValueError (UnsafeFile) for one that is unusable."""
    d = Path(d)
    if not os.path.lexists(d / MANIFEST):
        raise MissingInput(
            f"{d} has no manifest.json: not an hsdump dataset (or its "
            "first writer has not started yet)"
        )
    return read_json_object(d / MANIFEST, d, MANIFEST_LIMIT)


def read_index(d: Path) -> Tuple[Optional[dict], Optional[str]]:
    """(index.json as an object, None), (None, why it is not used), or (None, None) without
    one. A file that is not a regular file inside `d` raises UnsafeFile: it is refused, not
    skipped; one that does not parse or names another format is left out, since the commit
    logs hold every record it compacts."""
    d = Path(d)
    if not os.path.lexists(d / INDEX):
        return None, None
    data = read_inside(d / INDEX, d, limit=ID_LIMIT)
    try:
        idx = parse_json(data, INDEX)
    except ValueError as e:
        return None, str(e)
    if not isinstance(idx, dict):
        return None, f"{INDEX} holds a JSON {type(idx).__name__}, not an object"
    if idx.get("format") != FORMAT or idx.get("format_version") not in SUPPORTED_VERSIONS:
        return None, (
            f"{INDEX} names format {str(idx.get('format'))[:60]!r} version "
            f"{str(idx.get('format_version'))[:20]!r}, not one this reader knows "
            f"({FORMAT} {SUPPORTED_VERSIONS})"
        )
    return idx, None


def load(d: Path) -> Commits:
    """The dataset's committed shards and samples: index.json plus every log's tail.

    Raises FileNotFoundError for a folder without manifest.json; ValueError for a manifest
    that does not parse or names an unknown format, and UnsafeFile (a ValueError) for a
    manifest, index or log that is not a regular file inside the folder. An index.json that
    does not parse is left out (`notes` says why) and the logs are read from their start:
    they hold every record. Everything else that is wrong in a record is collected in
    `problems` and that record left out."""
    d = Path(d)
    m = read_manifest(d)
    idx, why = read_index(d)
    mv = m.get("format_version")
    if mv not in SUPPORTED_VERSIONS:
        raise Refusal(
            f"{d}: manifest.json names format version {str(mv)[:20]!r}; this "
            f"reader knows {SUPPORTED_VERSIONS}"
        )
    notes = []
    if why is not None:
        if mv == 1 and not log_names(d):  # a version 1 index is the only record
            raise Refusal(
                f"{d}: {why}; in a version 1 dataset it is the only list of what the dataset holds"
            )
        notes.append(
            (
                INDEX,
                f"{why}: it is ignored, and every commit log is read from its "
                "start instead (the logs hold every record; `hsdump compact` "
                "rewrites it)",
            )
        )
    if idx is None and mv == 1 and why is None:  # a version 1 dataset before its first commit
        return Commits(version=1)
    if idx is not None and idx["format_version"] == 1:
        return _from_v1(idx)
    c = Commits(version=VERSION)
    c.notes = notes
    covers = {}
    if idx is not None:
        if c._add_columns(idx):  # else malformed: its records are re-read from the logs
            covers = idx.get("covers")
            if not isinstance(covers, dict):
                c.problems.append(
                    (
                        INDEX,
                        f"covers is {str(covers)[:60]!r}, not an object of "
                        "byte offsets; the logs are read from their start",
                    )
                )
                covers = {}
        skipped = idx.get("skipped") or {}
        if not isinstance(skipped, dict):
            c.problems.append((INDEX, "skipped is not an object of sample ids"))
            skipped = {}
        for sid, reason in skipped.items():
            c._add_record({"skipped": {sid: reason}}, INDEX)
    for name in log_names(d):
        path = d / LOG_DIR / (name + LOG_SUFFIX)
        where = f"{LOG_DIR}/{name}{LOG_SUFFIX}"
        size = os.stat(real_file(path, d)).st_size  # UnsafeFile: refused by name
        start = covers.get(name, 0)
        if not _ints([start]):
            c.problems.append(
                (
                    where,
                    f"index.json covers it up to byte {str(start)[:40]}, "
                    "not a byte offset; read from its start",
                )
            )
            start = 0
        if start > size:
            c.problems.append(
                (where, f"index.json covers it up to byte {start} but it has {size} bytes")
            )
            start = size
        recs, end, torn, bad = read_log(path, start, d)
        for b in bad:
            c.problems.append((where, f"a record that does not parse at {b}"))
        for off, rec in recs:
            c._add_record(rec, f"{where} byte {off}")
        c.covers[name] = end
        if torn:
            c.torn[name] = torn
    for name in set(covers) - set(c.covers):
        c.problems.append((INDEX, f"covers log {name!r}, which is not in {LOG_DIR}/"))
    return c.finish()


def _from_v1(idx: dict) -> Commits:
    c = Commits(version=1)
    shards = idx.get("shards") if isinstance(idx.get("shards"), dict) else {}
    samples = idx.get("samples") if isinstance(idx.get("samples"), dict) else {}
    by_shard: Dict[str, List[int]] = {}
    for n, m in shards.items():
        if (
            isinstance(m, dict)
            and os.path.basename(n) == n
            and safe_relpath(n)
            and _ints([m.get("bytes")])
            and isinstance(m.get("sha256"), str)
        ):
            by_shard[n] = []
        else:
            c.problems.append(
                (
                    INDEX,
                    f"shard {n[:80]!r}: not a .safetensors file of the "
                    "dataset folder with a valid bytes and sha256",
                )
            )
    for sid, name in samples.items():
        if id_value(sid) is None:
            c.problems.append((INDEX, f"sample id {sid[:40]!r} is not an int64 >= 0"))
        elif isinstance(name, str) and name in by_shard:
            by_shard[name].append(id_value(sid))
        else:
            c.problems.append(
                (
                    f"sample {sid}",
                    f"index.json places it in {str(name)[:80]!r}, "
                    "which index.json does not list among its "
                    "shards",
                )
            )
    for name, ids in by_shard.items():
        meta = shards[name]
        c.names.append(name)
        c.nbytes.append(meta["bytes"])
        c.sha256.append(meta["sha256"])
        c.ids.extend(sorted(ids))
        c.starts.append(len(c.ids))
    skipped = idx.get("skipped") if isinstance(idx.get("skipped"), dict) else {}
    for sid, reason in skipped.items():
        if id_value(sid) is not None:
            c.skipped[id_value(sid)] = str(reason)[:1000]
    return c.finish()


# ---------------------------------------------------------------------- writing
def write_index(d: Path, c: Commits) -> None:
    """Replace index.json with `c` compacted (atomically; crash-safe at every instant)."""
    with atomic_file(Path(d) / INDEX, fault_point="before_compact") as f:
        for chunk in c.index_lines():
            f.write(chunk.encode())


def compact(d: Path) -> Commits:
    """Rewrite index.json from the index and the logs' tails. Call it under the dataset's
    lock (`.lock`), so that two compactions do not race; readers never need it: they read
    the logs' tails past what the index covers."""
    c = load(d)
    if c.version == VERSION:
        write_index(d, c)
    return c


@contextlib.contextmanager
def dataset_lock(d: Path, wait: bool = True):
    """The folder's `.lock` (taken to create or check manifest.json, to compact and to replace
    a regenerated dataset's token_freq.json, never while committing). Yields False, without
    the lock, if `wait` is off and it is taken."""
    with open(Path(d) / LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compact_locked(d: Path, wait: bool = True) -> Optional[Commits]:
    """`compact` under the dataset's lock; None if `wait` is off and another process is
    compacting (its index, or a later one, covers what it reads)."""
    with dataset_lock(d, wait) as held:
        return compact(d) if held else None


def main(argv=None) -> int:
    """`python -m hsdump compact OUT`: rewrite OUT/index.json from every commit log, e.g.
    once all jobs of a multi-job run are done (each job compacts when it ends, unless another
    is compacting at that moment). Never needed for correctness: readers read the logs."""
    import argparse
    import sys

    from hsdump.command import prog

    ap = argparse.ArgumentParser(prog=prog("compact"), description=main.__doc__)
    ap.add_argument("out", metavar="OUT", help="dataset directory")
    args = ap.parse_args(argv)
    try:
        if version_of(Path(args.out)) != VERSION:
            print(f"{args.out}: format version 1 has no commit logs; nothing to compact")
            return 0
        c = compact_locked(Path(args.out))
    except (OSError, ValueError) as e:
        print(f"{prog('compact')}: {e}", file=sys.stderr)
        return 2
    print(
        f"{args.out}/index.json: {len(c)} samples in {len(c.names)} shards, "
        f"{len(c.covers)} commit logs"
    )
    return 0


class LogBusy(Refusal):
    """Another live process holds this writer's commit log (a bad launch: exit status 2)."""


class CommitLog:
    """One writer's append-only log. Opening it takes an exclusive lock on the log file itself
    (held until close: two processes never append to one log) and cuts a torn last record."""

    def __init__(self, d: Path, tag: str):
        self.path = log_path(d, tag)
        make_dirs(self.path.parent)
        new = not self.path.exists()
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise LogBusy(
                f"{self.path} is locked by another process: a job with the same "
                "dist.job_index and dist.num_jobs is already writing this dataset. "
                "Stop it first, or check the job index"
            ) from None
        if new:
            fsync_dir(self.path.parent)
        self._cut_torn_tail()

    def _cut_torn_tail(self) -> None:
        size = os.fstat(self.fd).st_size
        end = size
        while end > 0:
            start = max(0, end - 65536)
            chunk = os.pread(self.fd, end - start, start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                end = start + i + 1
                break
            end = start
        if end != size:
            os.ftruncate(self.fd, end)
            os.fsync(self.fd)

    def append(self, rec: dict, sync: bool = True) -> None:
        data = (json.dumps(rec, separators=(",", ":")) + "\n").encode()

        def torn():  # the crash test of a record cut in the middle
            os.write(self.fd, data[: len(data) // 2])
            os.fsync(self.fd)

        fault("mid_record", before=torn)
        size = os.fstat(self.fd).st_size
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
            if sync:
                os.fsync(self.fd)
        except BaseException:
            # a short write (disk full) must not leave a part line for the next record to
            # join: cut back to where this record began
            try:
                os.ftruncate(self.fd, size)
            except OSError:
                pass
            raise

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


class IdTable(Mapping):
    """sample id -> shard name over sorted columns: a 1M-sample dataset holds three arrays
    here, not a million-entry dict (lookups are a binary search)."""

    def __init__(self, sids, shard, names: List[str]):
        self.sids, self.shard, self.names = sids, shard, names

    def position(self, sid: int) -> int:
        if not 0 <= sid < ID_LIMIT:
            raise KeyError(sid)
        i = int(np.searchsorted(self.sids, sid))
        if i >= len(self.sids) or int(self.sids[i]) != sid:
            raise KeyError(sid)
        return i

    def positions(self, ids: Sequence[int]):
        return np.searchsorted(self.sids, np.asarray(ids, dtype=np.int64))

    def __getitem__(self, sid: int) -> str:
        return self.names[int(self.shard[self.position(sid)])]

    def __contains__(self, sid) -> bool:
        try:
            self.position(int(sid))
        except (KeyError, TypeError, ValueError):
            return False
        return True

    def __len__(self) -> int:
        return len(self.sids)

    def __iter__(self):
        return iter(self.sids.tolist())
