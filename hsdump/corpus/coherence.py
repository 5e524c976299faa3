"""Does the tokenizer (and its chat template) belong to the model? Checked before the dataset is
tokenized and before the engine starts; each refusal is one line naming the fix.

A tokenizer of another model, or a template written for another tokenizer, gives ids that the
target model reads as something else: exit 0, `verify` OK, and a drafter trained on gibberish.
What is checked:
- the template's special role markers (`<|im_start|>`, `<｜User｜>`, ...: the `<|...|>` and
  `<｜...｜>` spellings, which are always special tokens) are single tokens of the tokenizer;
- the tokenizer's size against the model's `vocab_size` (a model's embedding may be padded past
  its tokenizer, by a few percent at most; never smaller);
- the tokenizer's BOS id against the model's `bos_token_id` (refused when both are set and
  differ), its EOS id against the model's `eos_token_id` (a warning: instruct models often end
  turns with another token than the config's).
"""

from __future__ import annotations

import logging
import re
from typing import List, Optional, Sequence

from hsdump.corpus.chat import TEMPLATES, chat_template_of, render_template, shipped_templates
from hsdump.errors import Refusal

log = logging.getLogger(__name__)

MARKER = re.compile(r"<[|｜][^<>\s]{1,48}?[|｜]>")
"""The spelling of special role markers: `<|im_start|>`, `<｜Assistant｜>`, `<|eot_id|>`."""

MIN_VOCAB_FRACTION = 0.9
"""A tokenizer smaller than this share of the model's vocab_size is another model's (padded
embeddings add well under 5%: Qwen 151,665 of 151,936, DeepSeek-V3 128,815 of 129,280)."""

_PROBE = [
    {"role": "system", "content": "hsdump-probe-system"},
    {"role": "user", "content": "hsdump-probe-user"},
    {"role": "assistant", "content": "hsdump-probe-assistant"},
    {"role": "user", "content": "hsdump-probe-user-2"},
]


def template_markers(tok, template: str) -> List[str]:
    """The special markers a conversation rendered with `template` holds (a probe with a
    system, user, assistant and user turn; without the system turn if the template refuses
    one), in order of first appearance."""
    text = None
    for probe in (_PROBE, _PROBE[1:]):
        try:
            text, _ = render_template(tok, template, probe, add_generation_prompt=True)
            break
        except Exception:  # noqa: BLE001 - a template may refuse system turns; try without
            continue
    if text is None:
        return []
    seen: List[str] = []
    for m in MARKER.findall(text):
        if m not in seen:
            seen.append(m)
    return seen


def check_tokenizer(
    tok,
    *,
    vocab_size: Optional[int],
    bos_token_id: Optional[int] = None,
    eos_token_ids: Sequence[int] = (),
    template_source: str = "the tokenizer's own chat template",
) -> None:
    """Raise ValueError (one line, the fix named) when `tok` or its chat template is not the
    model's: see the module's docstring."""
    fix_tok = "set model.tokenizer to the model's own tokenizer (or leave it unset)"
    n = len(tok)
    if vocab_size:
        if n > vocab_size:
            raise Refusal(
                f"the tokenizer has {n:,} tokens but the model's vocab_size is {vocab_size:,}: "
                f"its ids past {vocab_size - 1} have no embedding; {fix_tok}"
            )
        if n < MIN_VOCAB_FRACTION * vocab_size:
            raise Refusal(
                f"the tokenizer has {n:,} tokens but the model's vocab_size is {vocab_size:,}: "
                f"it is another model's tokenizer, and its ids mean other tokens to this "
                f"model; {fix_tok}"
            )
    bos = getattr(tok, "bos_token_id", None)
    if bos is not None and bos_token_id is not None and int(bos) != int(bos_token_id):
        raise Refusal(
            f"the tokenizer's BOS token {tok.bos_token!r} is id {bos}, the model's "
            f"bos_token_id is {bos_token_id}: the tokenizer is not this model's; {fix_tok}"
        )
    eos = getattr(tok, "eos_token_id", None)
    if eos is not None and eos_token_ids and int(eos) not in eos_token_ids:
        log.warning(
            "the tokenizer's EOS token %r is id %s, not among the model's eos_token_id %s: "
            "check that model.tokenizer is the model's own",
            getattr(tok, "eos_token", None),
            eos,
            list(eos_token_ids),
        )
    template = chat_template_of(tok)
    if not template:
        return
    for marker in template_markers(tok, template):
        pieces = tok(marker, add_special_tokens=False)["input_ids"]
        if len(pieces) != 1:
            raise Refusal(
                f"{template_source} writes the role marker {marker!r}, which this tokenizer "
                f"splits into {len(pieces)} tokens: the template is another model's. Unset "
                "model.chat_template to use the checkpoint's own template, or name one "
                "written for this tokenizer"
            )


_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "hsdump_probe_tool",
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
_PROBE_REPLY = {"role": "assistant", "content": "hsdump-probe-reply"}
_KEEPING: dict = {}


def keeping_templates(tok, field: str) -> List[str]:
    """The shipped templates that render `field` (`tools` or `reasoning_content`), found by
    rendering a probe conversation with and without it, whose special markers are single
    tokens of `tok`."""
    key = (field, getattr(tok, "name_or_path", ""), len(tok))
    if key in _KEEPING:
        return _KEEPING[key]
    user = {"role": "user", "content": "hsdump-probe-user"}
    found = []
    for name in shipped_templates():
        template = (TEMPLATES / name).read_text()
        if field == "tools":
            with_it, without = ([user, _PROBE_REPLY], _PROBE_TOOLS), ([user, _PROBE_REPLY], None)
        else:
            thought = {**_PROBE_REPLY, "reasoning_content": "hsdump-probe-reasoning"}
            with_it, without = ([user, thought], None), ([user, _PROBE_REPLY], None)
        try:
            a = render_template(tok, template, *with_it)[0]
            b = render_template(tok, template, *without)[0]
            markers = template_markers(tok, template)
        except Exception:  # noqa: BLE001 - a template that refuses the probe keeps nothing
            continue
        ids = [tok.convert_tokens_to_ids(m) for m in markers]
        if a != b and all(isinstance(i, int) and i != tok.unk_token_id for i in ids):
            found.append(name)
    _KEEPING[key] = found
    return found
