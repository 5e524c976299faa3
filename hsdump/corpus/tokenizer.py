"""The model's tokenizer: loaded with `model.chat_template` in place of its own when set.

Its source (model.tokenizer, else the model folder) is checked first (hsdump.locate), so a
folder without tokenizer files, a missing path or an unreachable hub id is one error that
names `model.tokenizer`, before any row is tokenized or the engine starts.

A tokenizer shipped as Kimi's is (`tiktoken.model` and `tokenizer_config.json`, no
`tokenizer.json`, and Python code that only trust_remote_code runs) is built from those two
files as a fast tokenizer when `model.trust_remote_code` is false (hsdump.corpus.tiktoken_tokenizer);
with it true, the checkpoint's own code loads it.
"""

from __future__ import annotations

import hashlib
import json

from hsdump.config import ModelConfig
from hsdump.corpus.chat import template_path
from hsdump.corpus.tiktoken_tokenizer import (
    hub_tiktoken_files,
    load_tiktoken_tokenizer,
    local_tiktoken_files,
)
from hsdump.errors import Refusal
from hsdump.locate import check_tokenizer_source


def load_tokenizer(model: ModelConfig, model_path: str):
    """The model's tokenizer, with `model.chat_template` in place of its own when set."""
    from transformers import AutoTokenizer

    template = template_path(model.chat_template).read_text() if model.chat_template else None
    source = model.tokenizer or model_path
    key = "model.tokenizer" if model.tokenizer else "model.path"
    # Kimi's layout (tiktoken.model, no tokenizer.json) without its code: built here
    files = None if model.trust_remote_code else local_tiktoken_files(source, key)
    if files is None:
        check_tokenizer_source(model, model_path)
        files = None if model.trust_remote_code else hub_tiktoken_files(source, key)
    if files is not None:
        return _mark(load_tiktoken_tokenizer(files, template, source, key), model)
    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError, ImportError, KeyError) as e:
        raise Refusal(
            f"the tokenizer of {key}={source!r} could not be loaded "
            f"({type(e).__name__}: {e}); set model.tokenizer to a folder or hub id "
            "whose tokenizer transformers can load (a tokenizer.json is the surest)"
        ) from e
    if template is not None:
        tok.chat_template = template
    return _mark(tok, model)


def _mark(tok, model: ModelConfig):
    """`tok` marked with the template in use: `hsdump_chat_template`, model.chat_template's name
    or None for the model's own (hsdump.corpus.masks says which in a dropped field's advice)."""
    try:
        tok.hsdump_chat_template = model.chat_template
    except AttributeError:  # an object that takes no attributes: the advice assumes its own
        pass
    return tok


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
