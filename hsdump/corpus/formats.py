"""Row formats: one dataset record to the conversation (or text) it holds.

ShareGPT (`from`/`value` turns), messages (`role`/`content` turns, with tool calls and
reasoning) and plain text; `detect_format` picks the format and column from the config, else
from the columns and the first rows. A record that cannot become a sample raises `BadRow`,
whose reason is what the summary counts.
"""

from __future__ import annotations

import json
from itertools import islice
from typing import Any, Dict, List, Optional, Tuple

from hsdump.config import DatasetConfig
from hsdump.corpus.sources import RAW, RAW_LINE

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
}
MESSAGE_ROLES = {"system", "user", "assistant", "tool"}
MESSAGE_KEYS = ("tool_calls", "tool_call_id", "name", "reasoning_content")
FORMATS = ("sharegpt", "messages", "text")
DEFAULT_COLUMN = {"sharegpt": "conversations", "messages": "messages", "text": "text"}


STARTS_WITH_ASSISTANT = (
    "the conversation opens with an assistant turn (after any system turns), answering no "
    "user turn: drop the leading assistant turn, or add the user turn it answered"
)
"""The detail of the bad row `starts_with_assistant` (checked before any rendering: a template
that renders a default system turn cannot render it incrementally, and no template renders
a reply to nothing the way the model saw its replies)."""


class BadRow(ValueError):
    """A dataset row that cannot become a training sample; the message names the reason."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def dataset_record(ds_row: Dict[str, Any]) -> Any:
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
            rec = dataset_record(row)
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


TURN_KEYS = {"sharegpt": "from/value", "messages": "role/content"}
KIND_KEYS = {"sharegpt": "from/value turns", "messages": "role/content turns", "text": "strings"}
"""What a column of each format holds, for messages."""


def _kinds(recs: List[Dict[str, Any]], col: str) -> set:
    return {k for k in (_turn_kind(r.get(col)) for r in recs) if k}


def _format_fix(fmt: str, col: str, columns: List[str]) -> str:
    """The overrides that read column `col` as format `fmt`, and leaving dataset.format unset
    where detection would find the same."""
    if col == DEFAULT_COLUMN[fmt]:
        if [c for c in DEFAULT_COLUMN.values() if c in columns] == [col]:
            return f"set dataset.format={fmt}, or leave dataset.format unset to detect it"
        return f"set dataset.format={fmt}"
    return f"set dataset.format={fmt} dataset.column={col}"


def _named_format_mismatch(recs: List[Dict[str, Any]], columns: List[str], cfg: DatasetConfig):
    """The message for a dataset.format (and column) that the rows are not in, naming the
    format (and column) they are in; None when the named format may be right."""
    fmt = cfg.format
    col = cfg.column or DEFAULT_COLUMN[fmt]
    if columns and col not in columns:
        found = []
        for c in [c for c in DEFAULT_COLUMN.values() if c in columns] + [
            c for c in columns if c not in DEFAULT_COLUMN.values()
        ]:
            kinds = _kinds(recs, c)
            if len(kinds) == 1:
                found.append((c, kinds.pop()))
        msg = f"dataset.format={fmt}: the rows have no {col!r} column (columns: {columns})"
        if not found:
            return msg + "; set dataset.column=NAME, or leave dataset.format unset to detect it"
        hints = [
            f"column {c!r} holds {KIND_KEYS[k]} ({k}): "
            + (f"set dataset.column={c}" if k == fmt else _format_fix(k, c, columns))
            for c, k in found[:3]
        ]
        if all(k != fmt for _, k in found):
            hints.append(f"or set dataset.column=NAME, a column of {KIND_KEYS[fmt]}")
        return msg + "; " + "; ".join(hints)
    kinds = _kinds(recs, col)
    if len(kinds) == 1 and fmt not in kinds:
        k = kinds.pop()
        return (
            f"dataset.format={fmt}: column {col!r} holds {KIND_KEYS[k]}, the {k} format, not "
            f"{KIND_KEYS[fmt]}; {_format_fix(k, col, columns)}"
        )
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
        wrong = _named_format_mismatch(recs, columns, cfg)
        if wrong:
            raise ValueError(wrong)
        return cfg.format, cfg.column or DEFAULT_COLUMN[cfg.format]
    if cfg.column is not None:
        if columns and cfg.column not in columns:
            raise ValueError(f"dataset.column={cfg.column!r} is not a column; columns: {columns}")
        candidates = [cfg.column]
    else:
        candidates = [c for c in ("conversations", "messages", "text") if c in columns]
    if not candidates:
        raise ValueError(
            f"cannot tell the row format: no conversations, messages or text column "
            f"(columns: {columns}); set dataset.format=sharegpt|messages|text and "
            "dataset.column=NAME"
        )
    if len(candidates) > 1:
        raise ValueError(
            f"ambiguous row format: the columns {candidates} could each be the "
            "input; set dataset.format=sharegpt|messages|text (and "
            "dataset.column=NAME)"
        )
    col = candidates[0]
    kinds = {k for k in (_turn_kind(r.get(col)) for r in recs) if k}
    chat = kinds & {"sharegpt", "messages"}
    if len(chat) > 1:
        raise ValueError(
            f"ambiguous row format: column {col!r} holds both sharegpt (from/value) "
            "and messages (role/content) turns; set dataset.format=sharegpt|messages"
        )
    if chat and (col != "text" or kinds == chat):
        return chat.pop(), col  # a stray string among conversations is a bad row, not a format
    if kinds == {"text"} or (not kinds and col == "text"):
        return "text", col
    if not kinds and col in DEFAULT_COLUMN.values():
        return {v: k for k, v in DEFAULT_COLUMN.items()}[col], col
    raise ValueError(
        f"cannot tell the format of column {col!r} from its first rows "
        f"({sorted(kinds) or 'no usable row'}); set dataset.format=sharegpt|messages|text"
    )


def _content(role: str, content: Any, has_calls: bool) -> str:
    if content is None:
        if role == "assistant" and has_calls:
            return ""
        raise BadRow("bad_content", f"{role} turn has no content")
    if isinstance(content, list):  # OpenAI-style parts: text only
        if all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
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
        want = TURN_KEYS.get(fmt, "from/value or role/content")
        other = {"sharegpt": ("role", "messages"), "messages": ("from", "sharegpt")}.get(fmt)
        if other and t.get(other[0]) is not None:
            raise BadRow(
                "bad_turn",
                f"turn has no {want} but {TURN_KEYS[other[1]]}, the {other[1]} format: "
                f"set dataset.format={other[1]}, or leave dataset.format unset to detect it",
            )
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
    first = next((m["role"] for m in messages if m["role"] != "system"), None)
    if first == "assistant":
        raise BadRow("starts_with_assistant", STARTS_WITH_ASSISTANT)
    tools = rec.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except ValueError:
            raise BadRow("bad_tools", "tools is not valid JSON") from None
    return messages, (tools or None)
