"""Loss masks: the rendered text and its assistant spans to (input_ids, loss_mask).

`input_ids` are the tokenizer's encoding of the rendered text without added special tokens,
i.e. exactly what `tokenizer.apply_chat_template(messages, tokenize=True)` gives. Loss mask:
1 on the tokens the model generates in an assistant turn (its content, tool calls, reasoning
where the template renders it as generated, and the token that ends the turn), 0 on everything
else (system, user and tool turns, role headers and other template boilerplate). A token is in
the loss when any of its characters lies in an assistant span.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from hsdump.corpus.chat import chat_spans, render_template, require_template
from hsdump.corpus.coherence import keeping_templates
from hsdump.corpus.formats import BadRow


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
        raise BadRow(
            "segment_mismatch",
            "a slow tokenizer merges tokens across an assistant "
            "span boundary; use a fast tokenizer",
        )
    return ids, mask


def tokenize_conversation(
    tok, messages: List[Dict[str, Any]], tools=None
) -> Tuple[List[int], List[int]]:
    """Full conversation -> (input_ids, loss_mask), mask 1 on assistant turns."""
    return encode_conversation(tok, require_template(tok), messages, tools)


def encode_conversation(
    tok, template: str, messages: List[Dict[str, Any]], tools=None
) -> Tuple[List[int], List[int]]:
    """`template` applied to a conversation -> (input_ids, loss_mask on assistant turns)."""
    text, spans = chat_spans(tok, messages, tools, template)
    check_rendered(text, messages)
    check_fields(tok, template, messages, tools, text)
    return encode_with_spans(tok, text, spans)


def _said(content: str) -> str:
    # what of a turn's content a template must keep: templates may drop reasoning before
    # `</think>` from earlier turns (Qwen3, DeepSeek-R1 do) and trim whitespace
    return content.split("</think>")[-1].strip()


def check_rendered(text: str, messages: List[Dict[str, Any]]) -> None:
    """A bad row when the rendering leaves out a message's content or tool calls (a template
    that ignores `tool_calls`, say): a sample must hold what the conversation says, or the
    drafter learns from a turn that never happened (an assistant turn of only `<|im_end|>`)."""
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, str) and _said(content) and _said(content) not in text:
            raise BadRow(
                "template_drops_content",
                f"the chat template leaves out the content of message {i} ({m['role']}); "
                "use a template that renders it (model.chat_template=...)",
            )
        for c in m.get("tool_calls") or ():
            name = ((c.get("function") or {}) if isinstance(c, dict) else {}).get("name")
            if name and name not in text:
                raise BadRow(
                    "template_drops_tool_calls",
                    f"the chat template leaves out the tool call {name!r} of message {i}; "
                    "use a template that renders tool_calls (model.chat_template=...), or "
                    "drop tool-calling rows",
                )


def check_fields(tok, template: str, messages: List[Dict[str, Any]], tools, text: str) -> None:
    """A bad row when the template leaves out the row's tool definitions, or a reply's
    reasoning where that reply is the turn the model generates (the conversation up to it):
    found by rendering with and without the field. Reasoning a template drops from earlier
    turns once later ones follow (Qwen3's does) is the model's own history, not a loss."""
    import jinja2

    def render(msgs, tls):
        try:
            return render_template(tok, template, msgs, tls)[0]
        except (jinja2.TemplateError, TypeError, KeyError, AttributeError, ValueError) as e:
            raise BadRow("template_error", f"{type(e).__name__}: {e}") from None

    if tools and render(messages, None) == text:
        raise BadRow("template_drops_tools", _keep_hint(tok, "tools", "the tool definitions"))
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or not m.get("reasoning_content"):
            continue
        upto = messages[: i + 1]
        bare = upto[:i] + [{k: v for k, v in m.items() if k != "reasoning_content"}]
        if render(upto, tools) == render(bare, tools):
            raise BadRow(
                "template_drops_reasoning",
                _keep_hint(tok, "reasoning_content", f"the reasoning of message {i}"),
            )


def _keep_hint(tok, field: str, what: str) -> str:
    """The fix for a template that leaves out `field`: a shipped template that renders it; else
    a template that does, which under the model's own template (model.chat_template unset,
    `hsdump_chat_template` None on the tokenizer load_tokenizer gives) is not the model's own."""
    names = keeping_templates(tok, field)
    if names:
        use = "a template shipped with hsdump that renders it and fits this tokenizer: " + (
            ", ".join(f"model.chat_template={n}" for n in names)
        )
    elif getattr(tok, "hsdump_chat_template", None):
        use = (
            "no template shipped with hsdump renders it: use one that does "
            "(model.chat_template=FILE.jinja, e.g. the model's own: unset model.chat_template)"
        )
    else:
        use = (
            "this is the model's own template, and no template shipped with hsdump renders it "
            "for this tokenizer: write one that does (model.chat_template=FILE.jinja)"
        )
    return f"the chat template leaves out {what} (`{field}`); {use}; or drop the field"


def tokenize_text(tok, text: str) -> Tuple[List[int], List[int]]:
    """Plain text: the tokenizer's encoding with its special tokens (BOS), all in the loss."""
    ids = list(tok(text, add_special_tokens=True)["input_ids"])
    return ids, [1] * len(ids)
