"""The dataset format's one home (docs/format.md): file and folder names, key patterns, final
kinds, the dtype table, the size limits a reader enforces, the strict safetensors header
parser and the file hasher. Every other module imports these from here.

No torch import: `hsdump verify` and `hsdump inspect` answer on a folder that is no dataset
without loading torch; `torch_dtype` resolves a name when a caller needs the dtype itself.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from hsdump.errors import Refusal
from hsdump.store.files import open_inside, parse_json

# ------------------------------------------------------------------ names
FORMAT = "hsdump/speculators-v1"
"""manifest.json "format" and every shard's __metadata__["format"]."""
VERSION = 2
"""The format version this code writes (index.json, manifest.json, shard metadata)."""
SUPPORTED_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
INDEX = "index.json"
LOCK = ".lock"
LOG_DIR = "commits"
"""One commit log per writer: commits/<writer>.jsonl."""
LOG_SUFFIX = ".jsonl"
SHARD_DIR = "shards"
PER_DIR = 1000
"""Shards per folder: 1M samples of an 8B model (~200K shards) spread over ~200 folders."""
TOKEN_FREQ = "token_freq.json"
TOKEN_FREQ_FORMAT = "hsdump/token_freq"
TOKEN_FREQ_VERSION = 1
MAPPING = "vocab_mapping.safetensors"
FINAL_CHECK = "final_check"
"""The in-run final-state check's results, one per writer: final_check/<writer>.json."""
KNOWN_FILES = (MANIFEST, INDEX, LOCK, LOG_DIR, SHARD_DIR, TOKEN_FREQ, MAPPING, FINAL_CHECK)
"""Everything hsdump writes at a dataset's top level."""
SIDE_FILES = (TOKEN_FREQ,)
"""Files an extraction writes beside the dataset: part of it for output.overwrite."""

SHARD_SEQ_RE = re.compile(r"-(\d+)\.safetensors$")
"""The sequence number at the end of a version-2 shard name (shards/NNN/<writer>-<seq>)."""
SHARD_V1_RE = re.compile(r"^shard-.*\.safetensors(\.tmp.*)?$")
"""Version-1 shard names (one flat folder), and their temporary files."""
TMP_RE = re.compile(r"^(manifest|index)\.json\.tmp.*$")
KEY_RE = re.compile(
    r"^(?P<sid>\d+)/(input_ids|loss_mask|"
    r"(hidden_states/(?P<j>\d+)|final/(pre_norm|post_norm))(?P<scale>/scale)?)$"
)
"""A tensor key in a shard: `{sid}/input_ids`, `{sid}/loss_mask`, `{sid}/hidden_states/{j}`,
`{sid}/final/{kind}`; fp8 rows add `/scale`."""
SCALE_SUFFIX = "/scale"
"""fp8 rows: `{key}/scale` holds the float32 per-token scale."""
FP8_SCALING = "per_token_absmax"
"""Shard __metadata__["fp8_scaling"] of fp8 rows."""

FINAL_KINDS = ("pre_norm", "post_norm")
"""Final-layer states a sample may hold: `{i}/final/pre_norm` is the last decoder layer's
output before the model's final norm, `{i}/final/post_norm` after it."""


LAST_LAYER = "last-layer"
"""A reader's stand-in for a final state that was not captured: the last captured layer."""


def final_name(sid: int, kind: str) -> str:
    return f"{sid}/final/{kind}"


# ------------------------------------------------------------------ the writer's defaults
# measured on the H200 host (docs/performance.md, "The writer against the disk"): 6 threads x
# 256 MiB shards wrote at 0.90 of the disk's synced bandwidth where 3 x 1 GiB reached 0.66, and
# the flush of the shards open after the last sample took 0.60 s, not 3.18 s
SHARD_BYTES = 256 << 20
WRITER_THREADS = 6

# ------------------------------------------------------------------ limits a reader enforces
ID_LIMIT = 1 << 63
"""Sample ids, lengths, counts and byte sizes are int64 (the columns' type): 0 <= x < 2**63."""
MANIFEST_LIMIT = 64 << 20
"""manifest.json holds run-level facts and the resolved config: far below 64 MiB."""
LINE_LIMIT = 1 << 28
"""A commit record lists one shard's samples: 256 MiB is more than any shard's record."""
MAX_LAYERS = 1024
"""Captured layers per sample: at most a model's layer count, far below this."""
TOKEN_FREQ_LIMIT = 1 << 28
"""token_freq.json holds one count per distinct token: far below 256 MiB."""
VOCAB_LIMIT = 1 << 26
"""Largest target vocabulary accepted (t2d is one byte per token): far above any model's."""
HEADER_LIMIT = 100_000_000
"""The safetensors library's own limit on a header's size."""

# ------------------------------------------------------------------ dtypes
DTYPE_TABLE = (
    # safetensors code, torch name, bytes per item
    ("BOOL", "bool", 1),
    ("U8", "uint8", 1),
    ("I8", "int8", 1),
    ("I16", "int16", 2),
    ("U16", "uint16", 2),
    ("I32", "int32", 4),
    ("U32", "uint32", 4),
    ("I64", "int64", 8),
    ("U64", "uint64", 8),
    ("F16", "float16", 2),
    ("BF16", "bfloat16", 2),
    ("F32", "float32", 4),
    ("F64", "float64", 8),
    ("F8_E4M3", "float8_e4m3fn", 1),
    ("F8_E5M2", "float8_e5m2", 1),
)
ITEM_BYTES = {code: n for code, _, n in DTYPE_TABLE}
TORCH_NAME = {code: name for code, name, _ in DTYPE_TABLE}
ST_CODE = {name: code for code, name, _ in DTYPE_TABLE}
"""torch dtype name (str(dtype) without "torch.") -> safetensors code."""
ROW_DTYPES = ("bfloat16", "float16", "float32")
"""Dtypes the rows travel in from the engine (engine.dtype)."""
STORAGE = {
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
    "fp8": "float8_e4m3fn",
}
"""output.dtype -> the torch name of the stored hidden states (fp8: per-token scaled e4m3)."""
STORAGE_BYTES = {k: ITEM_BYTES[ST_CODE[v]] for k, v in STORAGE.items()}


def torch_dtype(name: str):
    """The torch dtype of an output.dtype, a torch name or a safetensors code."""
    import torch

    return getattr(torch, STORAGE.get(name) or TORCH_NAME.get(name) or name)


def st_code(dtype) -> str:
    """The safetensors code of a torch dtype."""
    return ST_CODE[str(dtype).removeprefix("torch.")]


# ------------------------------------------------------------------ the file hasher
def sha256_file(path, root=None, chunk: int = 1 << 22) -> str:
    """A file's sha256, streamed in fixed-size chunks (never the whole file in memory); with
    `root`, the file must be a regular file inside it (hsdump.store.files.open_inside)."""
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(
        open_inside(path, root) if root is not None else os.fspath(Path(path)), "rb", buffering=0
    ) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


# ------------------------------------------------------------------ safetensors headers
def read_header(path, root=None) -> tuple:
    """A safetensors file's JSON header and the byte offset where tensor data starts, read with
    two small reads (no tensor data touched) and checked whole, so that reading any tensor it
    lists stays inside the file: the header fits the file and the library's limit, parses to
    an object, `__metadata__` (if any) maps strings to strings, and every tensor has a known
    dtype, a shape of non-negative ints, and data_offsets [a, b] inside the file whose length
    is the shape's, overlapping no other tensor. Raises ValueError naming what is wrong
    (UnsafeFile for a file that is not a regular file inside `root`)."""
    fd = open_inside(path, root)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise Refusal(f"{path}: {size} bytes, too short for a safetensors header")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise Refusal(
                f"{path}: header length {n:,} exceeds the file ({size:,} bytes): "
                "the file is truncated or not safetensors"
            )
        if n > HEADER_LIMIT:
            raise Refusal(
                f"{path}: header length {n:,} is over safetensors' limit of {HEADER_LIMIT:,} bytes"
            )
        raw = os.pread(fd, n, 8)
    finally:
        os.close(fd)
    if len(raw) != n:
        raise Refusal(f"{path}: the file shrank while its header was read")
    header = parse_json(raw, f"{path}: its safetensors header")
    if not isinstance(header, dict):
        raise Refusal(f"{path}: its safetensors header is not a JSON object")
    md = header.get("__metadata__")
    if md is not None and not (
        isinstance(md, dict) and all(isinstance(v, str) for v in md.values())
    ):
        raise Refusal(f"{path}: its __metadata__ is not an object of strings")
    start, data = 8 + n, size - 8 - n
    spans = []
    for key, t in header.items():
        if key == "__metadata__":
            continue
        what = _tensor_problem(t, data)
        if what:
            raise Refusal(f"{path}: tensor {key[:80]!r} {what}")
        spans.append((*t["data_offsets"], key))
    spans.sort()
    for (a0, b0, k0), (a1, b1, k1) in zip(spans, spans[1:]):
        if a1 < b0:
            raise Refusal(f"{path}: tensors {k0[:80]!r} and {k1[:80]!r} overlap")
    return header, start


def _tensor_problem(t, data: int) -> str:
    """What is wrong with one tensor entry of a header whose file holds `data` bytes of
    tensor data ("" if nothing)."""
    if not isinstance(t, dict):
        return "is not an object"
    item = ITEM_BYTES.get(t.get("dtype")) if isinstance(t.get("dtype"), str) else None
    shape, off = t.get("shape"), t.get("data_offsets")
    if item is None:
        return f"has an unknown dtype {str(t.get('dtype'))[:20]!r}"
    if not (
        isinstance(shape, list)
        and len(shape) <= 8
        and all(type(x) is int and 0 <= x < 1 << 63 for x in shape)
    ):
        return f"has no valid shape ({str(shape)[:60]})"
    if not (isinstance(off, list) and len(off) == 2 and all(type(x) is int for x in off)):
        return f"has no valid data_offsets ({str(off)[:60]})"
    a, b = off
    if not 0 <= a <= b <= data:
        return f"data [{a}, {b}) lies outside the file ({data:,} data bytes)"
    count = 1
    for x in shape:
        count *= x
    if (b - a) != count * item:
        return (
            f"has {b - a:,} data bytes, but its shape {shape} of {t['dtype']} needs "
            f"{count * item:,}"
        )
    return ""


DRY = "dry"
"""The manifest's `engine` of a dataset written by engine=dry (hsdump.capture.dry)."""


class DryDatasetError(Refusal):
    """The dataset was written by `engine=dry`: its rows are not a model's hidden states."""


def check_not_dry(path, m: dict, allow: bool, how: str) -> None:
    """Refuse a dry dataset (manifest `engine: dry`) unless `allow`: training on its rows
    would teach a drafter nothing. `how` names the explicit way to read it anyway."""
    if m.get("engine") == DRY and not allow:
        raise DryDatasetError(
            f"{path} was written by engine=dry: its rows are a function of the token ids, not "
            f"the model's hidden states, so no drafter can learn from them. Extract it again "
            f"with a real engine (engine=cpu or engine=gpu) to train; to read it anyway (tests, "
            f"checking a launch) use {how}"
        )
