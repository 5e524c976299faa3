"""The layer convention: `hf_hidden_states_index`.

Index 0 is the embedding output; index k (1 <= k <= L - 1) is the output of decoder layer
k - 1, i.e. the residual stream entering decoder layer k, before the final norm; exactly
transformers' `output_hidden_states=True` tuple. SGLang's models keep a `layers_to_capture`
list whose entry i is the residual stream entering decoder layer i, so an hf index k is
entry k there in every family hsdump supports (tested against transformers per family).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from hsdump.errors import Refusal

if TYPE_CHECKING:
    from hsdump.config import Config

CONVENTION = "hf_hidden_states_index"


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    max_position_embeddings: Optional[int]
    vocab_size: Optional[int] = None
    bos_token_id: Optional[int] = None
    eos_token_ids: Tuple[int, ...] = ()
    context_length: Optional[int] = None
    """The context SGLang derives from config.json (`sglang_context`)."""


def read_model_info(model_path: str, trust_remote_code: bool = False) -> ModelInfo:
    """hidden size, depth and architecture from the model's config.json (local or hub)."""
    cfg_file = os.path.join(model_path, "config.json")
    if os.path.isfile(cfg_file):
        with open(cfg_file) as f:
            raw = json.load(f)
    else:
        from transformers import AutoConfig

        raw = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code).to_dict()
    text = raw.get("text_config") or raw
    archs = raw.get("architectures") or []
    if not archs:
        raise Refusal(f"{model_path}/config.json names no `architectures`")
    return ModelInfo(
        architecture=archs[0],
        hidden_size=int(text["hidden_size"]),
        num_hidden_layers=int(text["num_hidden_layers"]),
        max_position_embeddings=text.get("max_position_embeddings"),
        vocab_size=text.get("vocab_size"),
        bos_token_id=_first_set(text, raw, "bos_token_id"),
        eos_token_ids=_id_tuple(_first_set(text, raw, "eos_token_id")),
        context_length=sglang_context(text),
    )


def _first_set(text: dict, raw: dict, key: str):
    v = text.get(key)
    return raw.get(key) if v is None else v


def _id_tuple(v) -> Tuple[int, ...]:
    if v is None:
        return ()
    return tuple(int(i) for i in (v if isinstance(v, (list, tuple)) else [v]))


def eagle3_default(num_layers: int) -> List[int]:
    return [2, num_layers // 2, num_layers - 3]


def resolve_layers(
    layers: Optional[Sequence[int]], default_layers: Optional[Sequence[int]], num_layers: int
) -> List[int]:
    """The capture list: explicit, else the preset's, else EAGLE-3's; checked against L."""
    chosen = layers if layers is not None else default_layers
    source = "capture.layers" if layers is not None else "model.default_layers"
    if chosen is None:
        chosen, source = eagle3_default(num_layers), "EAGLE-3 default"
    out = [int(x) for x in chosen]
    if not out:
        raise Refusal(
            f"{source} is empty: name at least one layer, e.g. "
            f"capture.layers='{eagle3_default(num_layers)}'"
        )
    if len(set(out)) != len(out):
        if layers is None:  # a default the user did not write: the model is too shallow for it
            raise Refusal(
                f"{source}={out} repeats a layer: a {num_layers}-layer model is too shallow for "
                f"its spread; name the layers, each once, e.g. "
                f"capture.layers='{sorted(set(out))}'"
            )
        raise Refusal(f"{source}={out} repeats a layer; list each index once")
    bad = [k for k in out if not 1 <= k <= num_layers - 1]
    if bad:
        raise Refusal(
            f"{source}={out}: {bad} out of range for a model with {num_layers} decoder layers. "
            f"Indices follow {CONVENTION}: 1..{num_layers - 1} (k = output of decoder layer "
            f"k-1). The embedding output (0) and the last layer's output ({num_layers}) are not "
            "capturable through SGLang's aux-hidden-state path."
        )
    return out


SGLANG_PROMPT_MARGIN = {"0.5.17": 7, "0.5.23": 7}
"""Per SGLang release, how many tokens fewer than min(context, KV pool) its longest prompt has.
SGLang's scheduler reports `max_req_len = min(context_len - 1, kv_pool_tokens - 1)` and
`max_req_input_len = max_req_len - 5` (managers/tp_worker.py, `get_worker_info`: one slot for
the token a request generates, five more kept for output tokens), and refuses a prompt of
`len >= max_req_input_len` ("Input length (N tokens) exceeds the maximum allowed length (M
tokens)", managers/utils.py, `validate_input_length`): so the longest prompt it takes is
min(context, KV pool) - 7. The same in 0.5.17 and 0.5.23 (read in both releases' code; 0.5.23
also subtracts a dLLM block size, for diffusion models hsdump does not run). The tokenizer
manager's own check (`len + reserved < context_len`, `len + max_new_tokens <= context_len`)
is looser: hsdump sends one new token and runs no draft model (no reserved slots).
tests/test_rows.py checks the number against a running engine's own."""
DEFAULT_SGLANG = "0.5.23"

CONTEXT_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
"""The config.json keys SGLang reads the context length from, first found wins
(utils/hf_transformers/common.py, `get_context_length`, the same in 0.5.17 and 0.5.23)."""


def sglang_context(text: dict) -> int:
    """SGLang's context length of a model config (its text config): the first of CONTEXT_KEYS
    that is set, times the rope scaling factor unless the scaling names
    original_max_position_embeddings or is llama3's; 2048 when none is set."""
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    factor = rope.get("factor", 1) if isinstance(rope, dict) else 1
    if isinstance(rope, dict) and (
        "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3"
    ):
        factor = 1
    for key in CONTEXT_KEYS:
        if text.get(key) is not None:
            return int(factor * text[key])
    return 2048


def engine_context(cfg: Config, info: ModelInfo) -> Optional[int]:
    """The engine's context length: engine.extra.context_length when set, else what SGLang
    derives from the model's config.json (`sglang_context`; None for a hand-made ModelInfo
    without one: then max_position_embeddings)."""
    ctx = cfg.engine.extra.get("context_length")
    if ctx is not None:
        return int(ctx)
    return info.context_length if info.context_length is not None else info.max_position_embeddings


def kv_pool_tokens(cfg: Config) -> Optional[int]:
    """The engine's KV pool size when the settings fix it (engine.max_total_tokens, or
    engine.extra.max_total_tokens, which wins: it is passed to SGLang last); None when SGLang
    sizes it from free memory at start."""
    n = cfg.engine.extra.get("max_total_tokens", cfg.engine.max_total_tokens)
    return int(n) if n is not None else None


def installed_sglang() -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class EngineLimit:
    """The longest prompt the engine takes, and why."""

    tokens: int
    why: str


def engine_limit(cfg: Config, info: ModelInfo, version: Optional[str] = None) -> EngineLimit:
    """The longest prompt SGLang takes with these settings (SGLANG_PROMPT_MARGIN): known before
    the engine starts from the context and, when set, the KV pool size. A pool that SGLang sizes
    from memory may still come out smaller: the engine then says its own number at start
    (rows longer are bad rows `engine_refused`)."""
    version = version or installed_sglang() or DEFAULT_SGLANG
    margin = SGLANG_PROMPT_MARGIN.get(version, SGLANG_PROMPT_MARGIN[DEFAULT_SGLANG])
    ctx = engine_context(cfg, info) or 2048
    where = (
        f"engine.extra.context_length={ctx}"
        if "context_length" in cfg.engine.extra
        else f"the model's context {ctx}"
    )
    pool = kv_pool_tokens(cfg)
    if pool is not None and pool < ctx:
        where = f"the engine's KV pool of {pool} tokens (max_total_tokens; context {ctx})"
        ctx = pool
    return EngineLimit(ctx - margin, f"SGLang {version} takes prompts of {where} less {margin}")


def length_limit(cfg: Config, info: ModelInfo) -> Tuple[int, str]:
    """(dataset.max_seq_len as the run uses it, where it came from). Unset (a user's dataset
    with no limit given): the longest prompt the engine takes (`engine_limit`)."""
    lim = engine_limit(cfg, info)
    if cfg.dataset.max_seq_len is not None:
        return cfg.dataset.max_seq_len, f"dataset.max_seq_len; {lim.why}: {lim.tokens}"
    return lim.tokens, lim.why


def check_length_limit(cfg: Config, info: ModelInfo) -> None:
    """Refuse, before the engine starts, a dataset.max_seq_len longer than the engine takes
    (SGLang would refuse every sample that long after its start), naming the number that
    works."""
    n = cfg.dataset.max_seq_len
    lim = engine_limit(cfg, info)
    if n is None or n <= lim.tokens:
        return
    pool, ctx = kv_pool_tokens(cfg), engine_context(cfg, info) or 2048
    grow = ""
    need = n + (pool - lim.tokens) if pool is not None else None  # the pool that holds n
    if pool is not None and pool < ctx and need <= ctx:  # the KV pool's size is the limit
        grow = (
            f", or give the engine a KV pool that holds it: engine.max_total_tokens={need} "
            "(engine=cpu sets 8192; on a GPU leaving it null sizes the pool from free memory)"
        )
    raise Refusal(
        f"dataset.max_seq_len={n} is longer than the engine takes: {lim.why}, "
        f"{lim.tokens} tokens. Set dataset.max_seq_len={lim.tokens} or less (or leave it "
        f"unset for {lim.tokens}){grow}"
    )
