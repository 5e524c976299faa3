"""File operations shared by the writer, the readers, the commit log and the JSON side files.

`atomic_file` writes under a temporary name, fsyncs, renames and fsyncs the folder, so a
reader sees either the old file or the new one, never a part. `fault` is the crash-test hook
the kill tests use to stop a run at exact places.

Reading: a dataset folder may come from elsewhere, so every reader (reader, verify, inspect,
export, vocab, compact, resume) opens its files through `open_inside` / `read_inside`: only
regular files (no FIFO, device or socket: they would hang or never end) whose real path is
inside the dataset folder (a symlink that resolves outside is refused by name), read up to
their size and a limit the format sets. Violations raise `UnsafeFile`, a ValueError whose
message names the file and the fix.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import uuid
from pathlib import Path
from typing import Callable, Dict, Optional

from hsdump.errors import Refusal

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
    return path.with_name(
        f"{path.name}.tmp.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    )


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


JSON_LIMIT = 1 << 30
"""Bytes of a JSON side file hsdump reads whole when no tighter limit applies."""


class UnsafeFile(Refusal):
    """A dataset file hsdump will not read: not a regular file, outside the dataset folder, or
    larger than its format allows."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return name
    return "special file"


def real_file(path, root=None) -> str:
    """The real path of `path` after checking that it is a regular file and, with `root` (the
    dataset folder), that it resolves inside root. Raises FileNotFoundError when it is absent,
    UnsafeFile otherwise."""
    real = os.path.realpath(path)
    if root is not None:
        base = os.path.realpath(root)
        if real != base and not real.startswith(base.rstrip(os.sep) + os.sep):
            raise UnsafeFile(
                f"{path} is a link that resolves to {real}, outside the dataset "
                f"folder {root}; hsdump reads only files inside it (replace the "
                "link with the file itself)"
            )
    st = os.stat(real)  # FileNotFoundError for a dangling link or an absent file
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(
            f"{path} is a {_kind(st.st_mode)}, not a regular file; hsdump reads "
            "only regular files (remove it, or replace it with the file)"
        )
    return real


def open_inside(path, root=None) -> int:
    """A read-only descriptor of `path`, checked as `real_file` says (and again once open, so
    a file swapped meanwhile for a FIFO or a device is still refused, without blocking)."""
    real = real_file(path, root)
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFile(f"{path} is a {_kind(st.st_mode)}, not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_inside(path, root=None, limit: int = JSON_LIMIT, start: int = 0) -> bytes:
    """The bytes of `path` from `start` to its size (never more: a file that grows while it is
    read is read up to the size it had), refused when that is more than `limit`."""
    fd = open_inside(path, root)
    try:
        size = os.fstat(fd).st_size
        if size - start > limit:
            raise UnsafeFile(
                f"{path} holds {size_text(size - start)} to read, more than the "
                f"{size_text(limit)} such a file can hold; it is not one hsdump "
                "wrote"
            )
        data = os.pread(fd, max(0, size - start), start) if size - start < 1 << 30 else b""
        if len(data) == size - start or size <= start:
            return data
        out = bytearray(data)  # a larger file, or one read short: the rest in chunks
        pos = start + len(data)
        while pos < size:
            chunk = os.pread(fd, min(size - pos, 1 << 26), pos)
            if not chunk:
                break
            out += chunk
            pos += len(chunk)
        return bytes(out)
    finally:
        os.close(fd)


def parse_json(data: bytes, name) -> object:
    """JSON text to an object; anything that is not JSON (bad UTF-8, nesting too deep) is a
    ValueError naming `name`."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise Refusal(
            f"{name} does not parse as JSON ({type(e).__name__}: {str(e)[:200]})"
        ) from None


def read_json(path: Path, root=None, limit: int = JSON_LIMIT):
    """A JSON file read as `read_inside` does (`root`: the dataset folder it must lie in)."""
    return parse_json(read_inside(path, root, limit), path)


def read_json_object(path: Path, root=None, limit: int = JSON_LIMIT) -> dict:
    obj = read_json(path, root, limit)
    if not isinstance(obj, dict):
        raise Refusal(f"{path} holds a JSON {type(obj).__name__}, not an object")
    return obj


def size_text(n: float) -> str:
    """A byte count in the unit that fits: 512 B, 3.4 KiB, 12.0 MiB, 1.50 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(n):,} B"
            return f"{n:,.2f} {unit}" if unit in ("GiB", "TiB") else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)
