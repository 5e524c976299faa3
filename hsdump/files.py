"""Durable file operations shared by the writer, the commit log and the JSON side files.

`atomic_file` writes under a temporary name, fsyncs, renames and fsyncs the folder, so a
reader sees either the old file or the new one, never a part. `fault` is the crash-test hook
the kill tests use to stop a run at exact places.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import uuid
from pathlib import Path
from typing import Callable, Dict, Optional

_fault_hits: Dict[str, int] = {}


def fault(point: str, before: Optional[Callable[[], None]] = None) -> None:
    """Off unless HSDUMP_FAULT is set: `POINT@N` sends SIGKILL to this process the N-th time
    POINT is reached, `POINT@N:TERM` sends SIGTERM. `before` runs just before the signal (a
    torn write, say)."""
    spec = os.environ.get("HSDUMP_FAULT")
    if not spec:
        return
    where, _, sig = spec.partition(":")
    name, _, nth = where.partition("@")
    if name != point:
        return
    _fault_hits[point] = _fault_hits.get(point, 0) + 1
    if _fault_hits[point] == int(nth or 1):
        if before is not None:
            before()
        os.kill(os.getpid(), signal.SIGTERM if sig == "TERM" else signal.SIGKILL)


def tmp_name(path: Path) -> Path:
    """A temporary name beside `path` that no other process, on this host or another one
    sharing the file system, picks."""
    return path.with_name(f"{path.name}.tmp.{socket.gethostname()}.{os.getpid()}."
                          f"{uuid.uuid4().hex[:8]}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """mkdir -p whose new entries survive a crash (each new folder's parent is fsynced)."""
    missing = []
    p = Path(path)
    while not p.exists():
        missing.append(p)
        p = p.parent
    for q in reversed(missing):
        try:
            q.mkdir()
        except FileExistsError:  # another writer made it meanwhile
            pass
        fsync_dir(q.parent)


@contextlib.contextmanager
def atomic_file(path: Path, fault_point: str = ""):
    """A file under a temporary name in `path`'s folder; on success it is flushed, fsynced,
    renamed to `path` and the folder fsynced; on any error it is removed. (Buffered: large
    writes pass straight through, and short writes are retried, unlike a raw FileIO.)"""
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if fault_point:
            fault(fault_point)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write(path: Path, data: bytes, fault_point: str = "") -> None:
    with atomic_file(path, fault_point) as f:
        f.write(data)


def write_json(path: Path, obj, fault_point: str = "") -> None:
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode(), fault_point)


def read_json(path: Path):
    with open(path) as f:
        return json.load(f)
