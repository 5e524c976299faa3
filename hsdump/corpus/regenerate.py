"""Regenerating a conversation's answers with the target model (`regenerate.turns`).

A drafter accepts more tokens when it is trained on the target model's own outputs. For each
conversation, the assistant turns chosen by `turns` are rewritten in order: the prompt is the
chat template applied to the conversation so far (with the turns already rewritten) plus the
generation prompt, and the model's answer, up to its end of turn, replaces the turn. The sample
is then made from the rewritten conversation exactly as any other (hsdump.corpus.tokenization): its
`input_ids` are the template applied to it, its loss mask covers its assistant turns, and its
hidden states are captured from one prefill of those ids.

Generation goes through a `generate(requests) -> {key: {"text", ...}}` callable (the engine's);
nothing here imports sglang.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Callable, Dict, List, Sequence, Tuple

from hsdump.config import DatasetConfig, RegenerateConfig
from hsdump.corpus.chat import render_template
from hsdump.corpus.masks import encode_conversation
from hsdump.corpus.tokenization import length_policy

END_OF_TURN = (
    "<|eot_id|>",
    "<|im_end|>",
    "<｜end▁of▁sentence｜>",
    "<|end|>",
    "<|endoftext|>",
    "</s>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<|return|>",
)
"""Tokens that end an assistant turn in the common templates (those in the vocabulary stop
generation, besides the tokenizer's eos)."""
_THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.S)

Generate = Callable[[Sequence[Tuple[Any, List[int], dict]]], Dict[Any, dict]]


def stop_token_ids(tok) -> List[int]:
    vocab = tok.get_vocab()
    out = {vocab[t] for t in END_OF_TURN if t in vocab}
    if tok.eos_token_id is not None:
        out.add(int(tok.eos_token_id))
    return sorted(out)


def turns_to_rewrite(messages: List[Dict[str, Any]], turns: str) -> List[int]:
    """Indices of the assistant messages to regenerate (tool-calling turns are kept)."""
    plain = [
        i for i, m in enumerate(messages) if m["role"] == "assistant" and not m.get("tool_calls")
    ]
    if turns == "none" or not plain:
        return []
    return plain[-1:] if turns == "last" else plain


def sampling_params(cfg: RegenerateConfig, stop: List[int], sid: int, turn: int) -> dict:
    sp = {
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "stop_token_ids": stop,
        "skip_special_tokens": True,
    }
    if cfg.temperature > 0:  # reproducible per (seed, sample, turn), across resumes and jobs
        sp["sampling_seed"] = (cfg.seed * 1_000_003 + sid * 1_009 + turn) % (2**63)
    return sp


def answer_text(tok, out: dict, stop: Sequence[int]) -> str:
    """The generated answer as text: the engine's own detokenized text when it has one, else
    the output ids (without the stop token that ended the turn) decoded without special
    tokens; the template adds the end of turn back when it renders the conversation."""
    if out.get("text"):
        return out["text"]
    ids = list(out.get("output_ids") or ())
    while ids and ids[-1] in stop:
        ids.pop()
    return tok.decode(ids, skip_special_tokens=True)


def clean(text: str, reasoning: str) -> str:
    return _THINK.sub("", text, count=1) if reasoning == "drop" else text


def prompt_ids(tok, template: str, history: List[Dict[str, Any]], tools=None) -> List[int]:
    """The template applied to `history` with the generation prompt, as token ids."""
    text, _ = render_template(tok, template, history, tools, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def regenerate(
    items: Sequence[Tuple[int, List[Dict[str, Any]], Any]],
    tok,
    template: str,
    cfg: RegenerateConfig,
    generate: Generate,
) -> Dict[int, List[Dict[str, Any]]]:
    """{sid: rewritten messages} for items (sid, messages, tools). Round k rewrites each
    conversation's k-th chosen turn, all conversations at once (one batch per round)."""
    stop = stop_token_ids(tok)
    convs: Dict[int, List[Dict[str, Any]]] = {}
    todo: Dict[int, List[int]] = {}
    tools_of = {}
    for sid, messages, tools in items:
        idx = turns_to_rewrite(messages, cfg.turns)
        # `last`: the turns after the rewritten one answered the old text: they are dropped
        cut = idx[-1] + 1 if cfg.turns == "last" and idx else len(messages)
        convs[sid] = copy.deepcopy(messages[:cut])
        todo[sid] = idx
        tools_of[sid] = tools
    rnd = 0
    while True:
        reqs = []
        for sid, idx in todo.items():
            if rnd < len(idx):
                j = idx[rnd]
                ids = prompt_ids(tok, template, convs[sid][:j], tools_of[sid])
                reqs.append(((sid, j), ids, sampling_params(cfg, stop, sid, j)))
        if not reqs:
            return convs
        out = generate(reqs)
        for (sid, j), _, _ in reqs:
            if (sid, j) not in out:  # stopped early: this conversation is not finished
                convs.pop(sid, None)
                todo[sid] = []
                continue
            msg = {
                "role": "assistant",
                "content": clean(answer_text(tok, out[(sid, j)], stop), cfg.reasoning),
            }
            convs[sid][j] = msg
        rnd += 1


def to_sample(
    tok, template: str, messages: List[Dict[str, Any]], tools, cfg: DatasetConfig
) -> Tuple[List[int], List[int]]:
    """(input_ids, loss_mask) of a rewritten conversation under the dataset's length policy
    (hsdump.corpus.tokenization's, as for any sample); raises tokenization.Skip(reason)."""
    ids, mask = encode_conversation(tok, template, messages, tools)
    ids, mask, _ = length_policy(ids, mask, cfg.max_seq_len, cfg.truncation, cfg.min_seq_len)
    return ids, mask
