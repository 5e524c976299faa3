"""The tokenize stage: every row of the split to a sample (input_ids, loss_mask), or a skip.

Runs `datasets.map` over the rows (hsdump.corpus.formats -> hsdump.corpus.chat -> hsdump.corpus.masks per row),
applies the length policy (`max_seq_len`, `truncation`, `min_seq_len`), counts bad rows by
reason, and returns a `Tokenized` backed by the cached Arrow result. No sglang import here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Tuple

from hsdump.config import DatasetConfig
from hsdump.corpus.chat import (
    chat_template_of,
    has_generation_markers,
    require_template,
    template_sha256,
)
from hsdump.corpus.formats import (
    BadRow,
    dataset_record,
    detect_format,
    peek_records,
    row_to_sample,
    unused_fields,
)
from hsdump.corpus.masks import encode_conversation, tokenize_text
from hsdump.corpus.sources import dataset_fingerprint, source_info
from hsdump.corpus.tokenizer import tokenizer_sha256
from hsdump.errors import Refusal

log = logging.getLogger(__name__)

MASK_VERSION = "4"  # 2: renderings that drop content or tool calls are bad rows; 3: system
# and tools fields, reasoning spellings and JSON-text turns read, dropped tools/reasoning bad rows;
# 4: a dropped field's advice says whether the template is the model's own
"""Part of the tokenization cache key: bump when the mask or the rendering logic changes."""
LENGTH_REASONS = {
    "too_long",
    "too_short",
    "no_assistant_tokens",
    "no_assistant_tokens_after_truncation",
}
"""Skip reasons of the length policy: always skipped and counted, whatever on_bad_row says."""


class Skip(Exception):
    """A well-formed row that the length policy leaves out; always skipped and counted."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


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
            yield from self._col.take(self._pos[k : k + 1024]).to_pylist()

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
    empty), used by hsdump.store.stats for fast counting; None for hand-built instances."""
    tokens: int = 0
    """Total tokens over kept samples."""
    loss_tokens: int = 0
    """Loss-masked tokens over kept samples."""
    lengths: List[int] = field(default_factory=list)
    """Per kept sample, len(input_ids) (cheap, unlike materializing input_ids[i])."""

    def summary(self) -> Dict[str, Any]:
        """The facts worth recording in the manifest."""
        return {
            "rows": self.rows,
            "samples": len(self.ids),
            "skipped_rows": dict(self.skipped),
            "truncated": self.truncated,
            "format": self.format,
            "column": self.column,
            "mask_source": self.mask_source,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "source": self.source,
        }


def tokenize_fingerprint(ds, tok, cfg: DatasetConfig, fmt: str, column: str) -> str:
    key = [
        dataset_fingerprint(ds),
        MASK_VERSION,
        tokenizer_sha256(tok),
        template_sha256(tok),
        # the bad rows' advice differs for the model's own template and a named one
        getattr(tok, "hsdump_chat_template", None),
        fmt,
        column,
        cfg.max_seq_len,
        cfg.truncation,
        cfg.min_seq_len,
    ]
    return "hsdump-tok-" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]


def length_policy(
    ids: List[int], mask: List[int], max_seq_len: int, truncation: str, min_seq_len: int
) -> Tuple[List[int], List[int], bool]:
    """(ids, mask, truncated) under the dataset's length policy; raises Skip(reason) for a
    sample with nothing in the loss, too short, or too long under truncation=skip."""
    if not any(mask):
        raise Skip("no_assistant_tokens")
    if len(ids) < min_seq_len:
        raise Skip("too_short")
    if len(ids) <= max_seq_len:
        return ids, mask, False
    if truncation == "skip":
        raise Skip("too_long")
    ids, mask = ids[:max_seq_len], mask[:max_seq_len]
    if not any(mask):
        raise Skip("no_assistant_tokens_after_truncation")
    return ids, mask, True


def sample_fn(tok, template, fmt, column, max_seq_len, truncation, min_seq_len):
    def fn(row, idx):
        res = {
            "id": idx,
            "input_ids": [],
            "loss_mask": [],
            "skip": "",
            "detail": "",
            "truncated": False,
            "length": 0,
        }
        try:
            sample = row_to_sample(dataset_record(row), fmt, column)
            if fmt == "text":
                ids, mask = tokenize_text(tok, sample)
            else:
                messages, tools = sample
                if not any(m["role"] == "assistant" for m in messages):
                    raise Skip("no_assistant_tokens")
                ids, mask = encode_conversation(tok, template, messages, tools)
            res["length"] = len(ids)
            ids, mask, res["truncated"] = length_policy(
                ids, mask, max_seq_len, truncation, min_seq_len
            )
            res["input_ids"], res["loss_mask"] = ids, mask
        except BadRow as e:
            res["skip"], res["detail"] = e.reason, e.detail
        except Skip as e:
            res["skip"] = e.reason
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
        return Tokenized(
            ids=[], input_ids=[], loss_mask=[], skipped={}, rows=0, truncated=0, source=info
        )
    fmt, column = detect_format(ds, cfg)
    unused = unused_fields(peek_records(ds), fmt, column)
    if unused:  # named: a turn key left unread may be meant for the mask (a `weight`)
        log.log(
            logging.WARNING if "turn keys" in unused else logging.INFO,
            "fields hsdump does not read (first rows): %s; it reads the %r column%s",
            "; ".join(f"{k} {v}" for k, v in unused.items()),
            column,
            ""
            if fmt == "text"
            else " (turns: role/content or from/value, tool_calls, tool_call_id, name, "
            "reasoning_content/reasoning/thinking) and system/system_prompt/system_message, "
            "tools/functions",
        )
    template = chat_template_of(tok) if fmt == "text" else require_template(tok)
    mask_source = (
        "all_tokens"
        if fmt == "text"
        else "generation_markers"
        if has_generation_markers(template)
        else "incremental"
    )
    fn = sample_fn(tok, template, fmt, column, cfg.max_seq_len, cfg.truncation, cfg.min_seq_len)
    features = datasets.Features(
        {
            "id": datasets.Value("int64"),
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "loss_mask": datasets.Sequence(datasets.Value("int8")),
            "skip": datasets.Value("string"),
            "detail": datasets.Value("string"),
            "truncated": datasets.Value("bool"),
            "length": datasets.Value("int32"),
        }
    )
    num_proc = cfg.num_proc if cfg.num_proc > 1 and len(ds) >= 2 * cfg.num_proc else None
    if num_proc:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not progress:
        datasets.disable_progress_bars()
    try:
        out = ds.map(
            fn,
            with_indices=True,
            remove_columns=ds.column_names,
            num_proc=num_proc,
            features=features,
            load_from_cache_file=cfg.cache,
            new_fingerprint=tokenize_fingerprint(ds, tok, cfg, fmt, column),
            desc=f"tokenizing ({fmt})",
        )
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
        raise Refusal(
            f"dataset row {r['id']}: {r['skip']}{detail} ({sum(bad.values())} bad "
            f"rows in all: {bad}; set dataset.on_bad_row=skip to skip such rows)"
        )
    table = out.data
    ids_col, mask_col = table.column("input_ids"), table.column("loss_mask")
    truncated = sum(out.select(keep)["truncated"]) if keep else 0
    data = Tokenized(
        ids=[int(x) for x in out.select(keep)["id"]] if keep else [],
        input_ids=RowsView(ids_col, keep),
        loss_mask=RowsView(mask_col, keep),
        skipped=skipped,
        rows=len(ds),
        truncated=int(truncated),
        format=fmt,
        column=column,
        mask_source=mask_source,
        source=info,
        table=out,
    )
    import pyarrow.compute as pc

    all_lengths = pc.list_value_length(ids_col).to_numpy(zero_copy_only=False)
    data.lengths = [int(x) for x in all_lengths[keep]]
    data.tokens = int(all_lengths.sum())
    data.loss_tokens = int(pc.sum(pc.list_flatten(mask_col)).as_py() or 0)
    dt = time.time() - t0
    log.info(
        "tokenize: %d rows -> %d samples, %s tokens (%s in the loss), %d truncated, "
        "skipped %s (%s rows, %s masks; %.1f s, %.0f rows/s)",
        len(ds),
        len(keep),
        f"{data.tokens:,}",
        f"{data.loss_tokens:,}",
        data.truncated,
        skipped or "none",
        fmt,
        mask_source,
        dt,
        len(ds) / max(dt, 1e-9),
    )
    if info.get("truncated"):
        log.warning(
            "the input file was cut off: only its %d complete records were read",
            info.get("records", 0),
        )
    return data
