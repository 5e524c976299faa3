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
        raise ValueError(f"{model_path}/config.json names no `architectures`")
    return ModelInfo(
        architecture=archs[0],
        hidden_size=int(text["hidden_size"]),
        num_hidden_layers=int(text["num_hidden_layers"]),
        max_position_embeddings=text.get("max_position_embeddings"),
        vocab_size=text.get("vocab_size"),
        bos_token_id=_first_set(text, raw, "bos_token_id"),
        eos_token_ids=_id_tuple(_first_set(text, raw, "eos_token_id")),
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
        raise ValueError(
            f"{source} is empty: name at least one layer, e.g. "
            f"capture.layers='{eagle3_default(num_layers)}'"
        )
    if len(set(out)) != len(out):
        raise ValueError(f"{source}={out} repeats a layer; list each index once")
    bad = [k for k in out if not 1 <= k <= num_layers - 1]
    if bad:
        raise ValueError(
            f"{source}={out}: {bad} out of range for a model with {num_layers} decoder layers. "
            f"Indices follow {CONVENTION}: 1..{num_layers - 1} (k = output of decoder layer "
            f"k-1). The embedding output (0) and the last layer's output ({num_layers}) are not "
            "capturable through SGLang's aux-hidden-state path."
        )
    return out


def engine_context(cfg: Config, info: ModelInfo) -> Optional[int]:
    """The longest sequence the engine takes: engine.extra.context_length when set, else the
    model's max_position_embeddings (None when config.json has neither)."""
    ctx = cfg.engine.extra.get("context_length")
    return int(ctx) if ctx is not None else info.max_position_embeddings


def length_limit(cfg: Config, info: ModelInfo) -> Tuple[int, str]:
    """(dataset.max_seq_len as the run uses it, where it came from). Unset (a user's dataset
    with no limit given): the engine's context less one, SGLang's longest prompt (it refuses an
    input as long as the context); 2048 when the model's config.json names no context."""
    if cfg.dataset.max_seq_len is not None:
        return cfg.dataset.max_seq_len, "dataset.max_seq_len"
    ctx = engine_context(cfg, info)
    if ctx is None:
        return 2048, "default: the model's config.json names no context length"
    return ctx - 1, f"the engine's context {ctx} less one"
