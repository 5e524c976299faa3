"""Row formats: one dataset record to the conversation (or text) it holds.

ShareGPT (`from`/`value` turns), messages (`role`/`content` turns, with tool calls and
reasoning) and plain text; `detect_format` picks the format and column from the config, else
from the columns and the first rows. A record that cannot become a sample raises `BadRow`,
whose reason is what the summary counts.
"""

from __future__ import annotations

import json
import logging
from itertools import islice
from typing import Any, Dict, List, Optional, Tuple

from hsdump.config import DatasetConfig
from hsdump.corpus.sources import RAW, RAW_LINE
from hsdump.errors import Refusal

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
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
"""A turn's reasoning, as chat datasets spell it; hsdump hands it to the template as
`reasoning_content` (the name chat templates read)."""
SYSTEM_KEYS = ("system", "system_prompt", "system_message")
"""Row fields holding the system prompt beside the turns; rendered as the first turn."""
TOOLS_KEYS = ("tools", "functions")
"""Row fields holding tool definitions (OpenAI `tools`, or its older `functions`: bare function
specs); handed to the template as `tools`."""
TURN_FIELDS = {
    "sharegpt": {"from", "value", *REASONING_KEYS},
    "messages": {"role", "content", *MESSAGE_KEYS, *REASONING_KEYS},
}
"""The keys of a turn that hsdump reads, per format; others are named in the run's log."""

log = logging.getLogger(__name__)
FORMATS = ("sharegpt", "messages", "text")
DEFAULT_COLUMN = {"sharegpt": "conversations", "messages": "messages", "text": "text"}


STARTS_WITH_ASSISTANT = (
    "the conversation opens with an assistant turn (after any system turns), answering no "
    "user turn: drop the leading assistant turn, or add the user turn it answered"
)
"""The detail of the bad row `starts_with_assistant` (checked before any rendering: a template
that renders a default system turn cannot render it incrementally, and no template renders
a reply to nothing the way the model saw its replies)."""


class BadRow(Refusal):
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


def json_turns(v: Any) -> Any:
    """A string holding a JSON list (a conversation exported as JSON text), decoded; anything
    else as it is."""
    if isinstance(v, str) and v.lstrip().startswith("["):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def _turn_kind(v: Any) -> Optional[str]:
    v = json_turns(v)
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
            raise Refusal(wrong)
        return cfg.format, cfg.column or DEFAULT_COLUMN[cfg.format]
    if cfg.column is not None:
        if columns and cfg.column not in columns:
            raise Refusal(f"dataset.column={cfg.column!r} is not a column; columns: {columns}")
        candidates = [cfg.column]
    else:
        candidates = [c for c in ("conversations", "messages", "text") if c in columns]
    if not candidates:
        raise Refusal(
            f"cannot tell the row format: no conversations, messages or text column "
            f"(columns: {columns}); set dataset.format=sharegpt|messages|text and "
            "dataset.column=NAME"
        )
    if len(candidates) > 1:
        raise Refusal(
            f"ambiguous row format: the columns {candidates} could each be the "
            "input; set dataset.format=sharegpt|messages|text (and "
            "dataset.column=NAME)"
        )
    col = candidates[0]
    kinds = {k for k in (_turn_kind(r.get(col)) for r in recs) if k}
    if kinds & {"sharegpt", "messages"} and any(isinstance(r.get(col), str) for r in recs):
        log.info("column %r holds conversations as JSON text: each row's is decoded", col)
    chat = kinds & {"sharegpt", "messages"}
    if len(chat) > 1:
        raise Refusal(
            f"ambiguous row format: column {col!r} holds both sharegpt (from/value) "
            "and messages (role/content) turns; set dataset.format=sharegpt|messages"
        )
    if chat and (col != "text" or kinds == chat):
        return chat.pop(), col  # a stray string among conversations is a bad row, not a format
    if kinds == {"text"} or (not kinds and col == "text"):
        return "text", col
    if not kinds and col in DEFAULT_COLUMN.values():
        return {v: k for k, v in DEFAULT_COLUMN.items()}[col], col
    raise Refusal(
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
            m = {"role": role, "content": _content(role, t.get("value"), False)}
            out.append(_with_reasoning(m, t))
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
                if t.get(k) is not None and k != "reasoning_content":
                    m[k] = t[k]
            if calls:
                m["tool_calls"] = [_tool_call(c) for c in calls]
            out.append(_with_reasoning(m, t))
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


def _with_reasoning(m: Dict[str, Any], turn: Dict[str, Any]) -> Dict[str, Any]:
    """`m` with the turn's reasoning (any spelling of REASONING_KEYS) as `reasoning_content`;
    a bad row when a turn other than the assistant's has some, or two spellings disagree."""
    found = {k: turn[k] for k in REASONING_KEYS if turn.get(k) not in (None, "")}
    if not found:
        return m
    values = list(found.values())
    if m["role"] != "assistant":
        raise BadRow("bad_turn", f"a {m['role']} turn has {sorted(found)}: only replies reason")
    if any(not isinstance(v, str) for v in values) or len(set(values)) > 1:
        raise BadRow("bad_turn", f"reasoning fields {sorted(found)} are not one string")
    m["reasoning_content"] = values[0]
    return m


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
    """A record to the text (format text) or (messages, tools) it holds; BadRow if unusable.

    Beside the turns (decoded first when the column holds them as JSON text), a row's system
    prompt (SYSTEM_KEYS) becomes the first turn and its tool definitions (TOOLS_KEYS) are the
    template's `tools`."""
    if not isinstance(rec, dict):
        raise BadRow("not_an_object", f"row is {type(rec).__name__}")
    if rec.get(column) is None:
        raise BadRow("missing_field", f"no {column!r} (keys: {sorted(rec)[:8]})")
    v = rec[column]
    if fmt == "text":
        return _content("text", v, False)
    if isinstance(v, str):
        v = json_turns(v)
        if isinstance(v, str):
            raise BadRow(
                "broken_json",
                f"column {column!r} holds text that is not a JSON list of turns "
                f"({v[:40]!r}); fix the row, or set dataset.format=text to read it as text",
            )
    messages = _with_system(to_messages(v, fmt), rec)
    first = next((m["role"] for m in messages if m["role"] != "system"), None)
    if first == "assistant":
        raise BadRow("starts_with_assistant", STARTS_WITH_ASSISTANT)
    return messages, _tools(rec)


def _with_system(messages: List[Dict[str, Any]], rec: Dict[str, Any]) -> List[Dict[str, Any]]:
    found = {k: rec[k] for k in SYSTEM_KEYS if rec.get(k) not in (None, "")}
    if not found:
        return messages
    values = list(found.values())
    if any(not isinstance(x, str) for x in values) or len(set(values)) > 1:
        raise BadRow("bad_content", f"system prompt fields {sorted(found)} are not one string")
    if messages[0]["role"] == "system":
        if messages[0]["content"] == values[0]:
            return messages
        raise BadRow(
            "two_system_prompts",
            f"the row's {sorted(found)[0]!r} field and its first turn are two different system "
            "prompts; keep one of them",
        )
    return [{"role": "system", "content": values[0]}] + messages


def _tools(rec: Dict[str, Any]) -> Optional[List[Dict[str, Any]]]:
    found = {k: rec[k] for k in TOOLS_KEYS if rec.get(k) not in (None, "", [])}
    if len(found) > 1:
        raise BadRow("bad_tools", f"both {sorted(found)}: keep one list of tool definitions")
    if not found:
        return None
    key, tools = next(iter(found.items()))
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except ValueError:
            raise BadRow("bad_tools", f"{key} is not valid JSON") from None
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRow("bad_tools", f"{key} is not a list of objects")
    if key == "functions":  # bare function specs, as OpenAI's older API took them
        tools = [{"type": "function", "function": f} for f in tools]
    return tools


def unused_fields(recs: List[Dict[str, Any]], fmt: str, column: str) -> Dict[str, List[str]]:
    """What of the first rows hsdump does not read: {"columns": [...], "turn keys": [...]}."""
    used = {column, *SYSTEM_KEYS, *TOOLS_KEYS} if fmt != "text" else {column}
    columns: List[str] = []
    keys: List[str] = []
    for r in recs:
        columns += [c for c in r if c not in used and c not in columns]
        turns = json_turns(r.get(column)) if fmt != "text" else None
        for t in turns if isinstance(turns, list) else ():
            if isinstance(t, dict):
                keys += [k for k in t if k not in TURN_FIELDS[fmt] and k not in keys]
    return {k: v for k, v in (("columns", columns), ("turn keys", keys)) if v}
