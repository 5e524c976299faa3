"""Chat templates: which template applies, and the assistant character spans of a rendering.

The rendered text is the chat template's output for the whole conversation. The assistant
spans come from the template's `{% generation %}` markers when it has them (the machinery
behind `apply_chat_template(return_assistant_tokens_mask=True)`), else from rendering the
conversation incrementally (see `incremental_spans`). hsdump.corpus.masks turns them into tokens.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import List, Optional, Tuple

from hsdump.corpus.formats import STARTS_WITH_ASSISTANT, BadRow
from hsdump.errors import MissingInput, Refusal

TEMPLATES = Path(__file__).with_name("templates")
"""The templates shipped with hsdump (package data)."""


def template_path(name: str) -> Path:
    """A chat template file: a path, or the name of one shipped in hsdump/corpus/templates."""
    p = Path(name)
    if p.exists():
        return p
    shipped = TEMPLATES / name
    if shipped.exists():
        return shipped
    if (TEMPLATES / f"{name}.jinja").exists():
        return TEMPLATES / f"{name}.jinja"
    raise MissingInput(
        f"model.chat_template={name!r}: no such file (shipped: {shipped_templates()})"
    )


def shipped_templates() -> List[str]:
    return sorted(x.name for x in TEMPLATES.glob("*.jinja"))


def require_template(tok) -> str:
    """The tokenizer's chat template; a ValueError naming the fix when it has none."""
    template = chat_template_of(tok)
    if not template:
        raise Refusal(
            "the tokenizer has no chat template; set model.chat_template=FILE.jinja "
            f"(shipped: {shipped_templates()})"
        )
    return template


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


def render_template(
    tok,
    template: str,
    messages,
    tools=None,
    add_generation_prompt=False,
    generation=False,
    **kwargs,
):
    from transformers.utils.chat_template_utils import render_jinja_template

    kw = {**tok.special_tokens_map, **kwargs}
    texts, gen = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=template,
        return_assistant_tokens_mask=generation,
        add_generation_prompt=add_generation_prompt,
        **kw,
    )
    return texts[0], (gen[0] if gen else [])


def incremental_spans(
    tok, template: str, messages, tools=None
) -> Tuple[str, List[Tuple[int, int]]]:
    """The fallback for templates without `{% generation %}` markers.

    Assistant turn t spans from the end of `render(messages[:t], add_generation_prompt=True)`
    to the end of `render(messages[:t+1])`, less trailing whitespace (the newline some
    templates put after the end-of-turn token is not generated). Each prefix must be a prefix
    of the full rendering; a template that renders earlier turns differently once later turns
    follow (Qwen3's official one does) gives the bad row `template_not_incremental`. (A
    conversation that opens with an assistant turn never gets here: `chat_spans` refuses it
    as `starts_with_assistant`, since a template that adds a default system turn, as ChatML
    ones do, renders no prefix of it.)
    """
    text, _ = render_template(tok, template, messages, tools)
    spans = []
    for t, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, _ = render_template(tok, template, messages[:t], tools, add_generation_prompt=True)
        upto, _ = render_template(tok, template, messages[: t + 1], tools)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise BadRow(
                "template_not_incremental",
                "the chat template renders earlier turns differently once later turns "
                "follow; use a template with {% generation %} markers "
                "(model.chat_template=..., see hsdump/corpus/templates)",
            )
        end = len(upto.rstrip())
        if end > len(before):
            spans.append((len(before), end))
    return text, spans


def chat_spans(
    tok, messages, tools=None, template: Optional[str] = None
) -> Tuple[str, List[Tuple[int, int]]]:
    """(rendered text, assistant character spans) for one conversation; one that opens with
    an assistant turn (after any system turns) is the bad row `starts_with_assistant`, before
    any rendering (as in hsdump.corpus.formats.row_to_sample)."""
    import jinja2

    first = next((m.get("role") for m in messages if m.get("role") != "system"), None)
    if first == "assistant":
        raise BadRow("starts_with_assistant", STARTS_WITH_ASSISTANT)
    template = template or chat_template_of(tok)
    try:
        if has_generation_markers(template):
            text, gen = render_template(tok, template, messages, tools, generation=True)
            return text, [(a, b) for a, b in gen if b > a]
        return incremental_spans(tok, template, messages, tools)
    except BadRow:
        raise
    except jinja2.TemplateError as e:
        raise BadRow("template_error", str(e)) from None
    except (TypeError, KeyError, AttributeError, ValueError, IndexError) as e:
        raise BadRow("template_error", f"{type(e).__name__}: {e}") from None
