"""What every family module shares: the `Family` record, the tokenizer's bos/eos ids, the
README table's markers and the sliding/full layer-pattern helper."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict

README_TABLE = ("<!-- families:begin -->", "<!-- families:end -->")
"""The markers around README's model-family table (bench/families_table.py writes it,
tests/test_families.py checks it is the generated one)."""

BOS, EOS = 0, 1  # the DeepSeek tokenizer's <｜begin▁of▁sentence｜> / <｜end▁of▁sentence｜>


@dataclass(frozen=True)
class Family:
    cls: str  # transformers class name == architectures[0]
    config: Callable[[int], object]  # vocab size -> transformers config
    extras: Dict = field(default_factory=dict)  # raw keys merged into config.json
    text_extras: Dict = field(default_factory=dict)  # raw keys merged into text_config
    vision_extras: Dict = field(default_factory=dict)  # raw keys merged into vision_config
    num_layers: int = 6
    note: str = ""
    # (old prefix, new prefix) renames of saved weight names, where transformers saves another
    # layout than the release (gemma-3-4b-it: `vision_tower.vision_model.*`; transformers
    # 5.19 writes `vision_tower.*`, which loads back the same but SGLang does not map)
    renames: tuple = ()
    # weight-name suffixes whose last two dims are swapped on save: transformers 5.19 writes some
    # fused-expert tensors in its own [E, out, in] layout, the release stores [E, in, out]
    # (transformers transposes on load, SGLang's loader expects the release's)
    transposed: tuple = ()


def _layers(n_sliding_then_full: int, n: int, a: str, b: str):
    """[a]*(k-1)+[b] repeated: layer i is b when (i + 1) % k == 0."""
    return [b if (i + 1) % n_sliding_then_full == 0 else a for i in range(n)]
