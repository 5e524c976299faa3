"""Tiny random checkpoints of every EAGLE-3 target family, built with transformers' own classes.

`FAMILIES` maps a family name to a `Family`: the transformers model class (also the
checkpoint's `architectures[0]`), a function that makes its config from the vocabulary size,
and the raw config.json keys of the real release that transformers' config class does not
write (SGLang reads several of them: GPT-OSS `swiglu_limit`, Qwen3-Next
`full_attention_interval`, DeepSeek `moe_layer_freq`, ...) plus the legacy `rope_theta` /
`rope_scaling` keys the real config.json carries (transformers 5 writes `rope_parameters`
instead; a reload converts the legacy keys the same way it does for the real checkpoint).

Widths are small (hidden 128-512, 6-8 layers, a few experts) but every structural option is
set as the real checkpoint has it: MoE routing and shared experts, sliding windows and
`layer_types`, attention sinks (GPT-OSS's are built in), hybrid linear-attention layers,
MLA with the real dims (SGLang's MLA kernels do not compile for smaller ones), tied embeddings
where the real model ties, rope scaling where the real one has it. Each folder also holds the
DeepSeek tokenizer (`hsdump.tiny.save_tokenizer`) and the vocabulary is its length, so token
ids are valid; `bos`/`eos` ids are those of that tokenizer.

    from hsdump.testing.families import FAMILIES, build
    path = build("qwen3_moe")        # cached under hsdump.tiny.cache_dir() / "families"

The tests (tests/test_families.py, through tests/families.py) and the family probe
(bench/families_probe.py) build them from here.

The modules: `base` (`Family`, bos/eos, the README table's markers), one per group of families
(`dense`, `moe`, `mla`: DeepSeek-style latent attention, `hybrid`: linear attention,
`multimodal`: a vision tower), `registry` (`FAMILIES`) and `checkpoints` (`build`,
`extract_overrides`); every name of theirs is importable from here.
`python -m hsdump.testing.families [NAME ...]` builds the named families (default: all).

Real configs the options come from (the release's config.json): Llama-3.1-8B-Instruct,
Qwen2.5-7B-Instruct, Qwen3-8B, Qwen3-30B-A3B, Qwen3-Next-80B-A3B-Instruct, Qwen3.5-27B /
Qwen3.5-35B-A3B (`text_config`), gpt-oss-20b, GLM-4.5-Air, MiniMax-M2, DeepSeek-V3,
DeepSeek-V3.2-Exp, gemma-3-1b-it (text) / gemma-3-4b-it (multimodal), Llama-4-Scout-17B-16E,
Phi-3-mini-4k-instruct, Mistral-7B-Instruct-v0.3; issue 33's targets (smaller: hidden 128, 4
layers, 4 experts, except where MLA's real dims are needed): Qwen1.5-MoE-A2.7B, Qwen3-VL-8B,
Qwen3-VL-30B-A3B, Qwen2.5-VL-7B, Ministral-3-8B-2512 (text model), Apertus-8B-2509,
DeepSeek-V2-Lite, GLM-4.7-Flash, gemma-4-e2b-it (text and multimodal), K-EXAONE-236B-A23B,
Mellum2-12B-A2.5B and GLM-5.3-Flash (from transformers' defaults, which are those checkpoints').
"""

from hsdump.testing.families.base import BOS, EOS, README_TABLE, Family, _layers
from hsdump.testing.families.checkpoints import (
    _merge,
    _rename_weights,
    _stale,
    build,
    extract_overrides,
    families_dir,
)
from hsdump.testing.families.dense import (
    LLAMA31_ROPE,
    MINISTRAL3_ROPE,
    apertus,
    llama,
    ministral3,
    mistral,
    phi3,
    qwen2,
    qwen3,
)
from hsdump.testing.families.hybrid import (
    QWEN3_NEXT_EXTRAS,
    QWEN35_ROPE,
    QWEN35_TEXT_EXTRAS,
    TINY_VISION_QWEN35,
    _qwen35_text,
    qwen3_5,
    qwen3_5_moe,
    qwen3_5_moe_vl,
    qwen3_5_vl,
    qwen3_next,
)
from hsdump.testing.families.mla import (
    DSV2_EXTRAS,
    DSV2_ROPE,
    DSV3_EXTRAS,
    DSV3_MLA,
    DSV3_ROPE,
    DSV32_EXTRAS,
    GLM4_MOE_LITE_EXTRAS,
    deepseek_v2,
    deepseek_v3,
    deepseek_v32,
    glm4_moe_lite,
    glm5_next,
)
from hsdump.testing.families.moe import (
    GLM4_MOE_EXTRAS,
    GPT_OSS_EXTRAS,
    MINIMAX_M2_EXTRAS,
    QWEN2_MOE_EXTRAS,
    exaone_moe,
    glm4_moe,
    gpt_oss,
    mellum,
    minimax_m2,
    qwen2_moe,
    qwen3_moe,
)
from hsdump.testing.families.multimodal import (
    GEMMA3_TEXT_EXTRAS,
    GEMMA3_VL_TEXT_EXTRAS,
    LLAMA4_ROPE,
    LLAMA4_TEXT_EXTRAS,
    QWEN2_5_VL_TEXT_EXTRAS,
    QWEN3_VL_ROPE,
    TINY_VISION_QWEN3_VL,
    _gemma3_text,
    _gemma4_text,
    _llama4_text,
    _qwen3_vl_text,
    gemma3,
    gemma3_vl,
    gemma4,
    gemma4_unified,
    gemma4_vl,
    llama4,
    llama4_text,
    qwen2_5_vl,
    qwen3_vl,
    qwen3_vl_moe,
)
from hsdump.testing.families.registry import FAMILIES
