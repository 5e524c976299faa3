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

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional

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


# --------------------------------------------------------------------------- dense
LLAMA31_ROPE = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def llama(vocab):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(LLAMA31_ROPE),
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


def qwen2(vocab):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        sliding_window=131072,
        use_sliding_window=False,
        max_window_layers=28,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


def qwen3(vocab):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        attention_bias=False,
        sliding_window=None,
        use_sliding_window=False,
        max_window_layers=36,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


def phi3(vocab):
    from transformers import Phi3Config

    # Phi-3-mini-4k-instruct: MHA (kv heads == heads), fused qkv / gate_up, sliding window
    # 2047, no rope scaling, untied
    return Phi3Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        original_max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        sliding_window=2047,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )


def mistral(vocab):
    from transformers import MistralConfig

    # Mistral-7B-Instruct-v0.3: no sliding window (null), theta 1e6, untied
    return MistralConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        sliding_window=None,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


# --------------------------------------------------------------------------- MoE
def qwen3_moe(vocab):
    from transformers import Qwen3MoeConfig

    # Qwen3-30B-A3B: every layer MoE (decoder_sparse_step 1, mlp_only_layers []), no shared
    # expert, top-k renormalised; 128 experts / top-8 scaled to 8 / top-2
    return Qwen3MoeConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        attention_bias=False,
        sliding_window=None,
        use_sliding_window=False,
        max_window_layers=48,
        router_aux_loss_coef=0.001,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


def gpt_oss(vocab):
    from transformers import GptOssConfig

    # gpt-oss-20b: alternating sliding (128) / full attention, attention sinks, biases,
    # yarn x32, 32 experts top-4 scaled to 8 top-2, swiglu clamp 7.0
    return GptOssConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=128,
        layer_types=_layers(2, 6, "sliding_attention", "full_attention"),
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=150000.0,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        swiglu_limit=7.0,
        attention_bias=True,
        router_aux_loss_coef=0.9,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


GPT_OSS_EXTRAS = {
    "experts_per_token": 2,
    "initial_context_length": 4096,
    "swiglu_limit": 7.0,
    "rope_theta": 150000.0,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
}


def glm4_moe(vocab):
    from transformers import Glm4MoeConfig

    # GLM-4.5-Air: partial rotary 0.5, qkv bias, first layer dense, 128 routed experts top-8
    # + 1 shared (scaled to 8 top-2 + 1), sigmoid routing with correction bias, n_group 1
    return Glm4MoeConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        partial_rotary_factor=0.5,
        attention_bias=True,
        use_qk_norm=False,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        routed_scaling_factor=1.0,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


GLM4_MOE_EXTRAS = {
    "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 0.5,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "head_dim": 64,
    "use_qk_norm": False,
}


def minimax_m2(vocab):
    from transformers import MiniMaxM2Config

    # MiniMax-M2: qk-norm over all heads (per_layer), partial rotary (rotary_dim = head/2),
    # 256 experts top-8 (scaled to 8 top-2), sigmoid scoring with routing bias, no shared
    return MiniMaxM2Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=196608,
        rms_norm_eps=1e-6,
        rope_theta=5000000.0,
        rotary_dim=32,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


MINIMAX_M2_EXTRAS = {
    "attn_type_list": [1] * 6,
    "qk_norm_type": "per_layer",
    "use_qk_norm": True,
    "rotary_dim": 32,
    "partial_rotary_factor": 0.5,
    "rope_theta": 5000000.0,
    "scoring_func": "sigmoid",
    "use_routing_bias": True,
    "shared_intermediate_size": 0,
    "use_mtp": True,
    "num_mtp_modules": 3,
    "mtp_transformer_layers": 1,
    "layernorm_full_attention_beta": 1.0,
    "layernorm_mlp_beta": 1.0,
    "sliding_window": None,
}


DSV3_ROPE = {
    "type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
DSV3_MLA = dict(
    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128
)


def deepseek_v3(vocab):
    from transformers import DeepseekV3Config

    # DeepSeek-V3: MLA with the real dims, first 3 (here 1) layers dense, 256 routed experts
    # top-8 (scaled to 8 top-2) + 1 shared, sigmoid noaux_tc routing, yarn x40
    return DeepseekV3Config(
        vocab_size=vocab,
        hidden_size=512,
        intermediate_size=1024,
        moe_intermediate_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        max_position_embeddings=163840,
        rope_theta=10000.0,
        rope_scaling=dict(DSV3_ROPE),
        **DSV3_MLA,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


DSV3_EXTRAS = {
    "moe_layer_freq": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "ep_size": 1,
    "seq_aux": True,
    "aux_loss_alpha": 0.001,
    "num_nextn_predict_layers": 1,
    "rope_theta": 10000.0,
    "rope_scaling": dict(DSV3_ROPE),
}


def deepseek_v32(vocab):
    from transformers import DeepseekV32Config

    # DeepSeek-V3.2-Exp: V3 plus the lightning indexer (DSA); index_* as released
    return DeepseekV32Config(
        vocab_size=vocab,
        hidden_size=512,
        intermediate_size=1024,
        moe_intermediate_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        max_position_embeddings=163840,
        rope_theta=10000.0,
        rope_scaling=dict(DSV3_ROPE),
        **DSV3_MLA,
        index_topk=2048,
        index_head_dim=128,
        index_n_heads=64,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


DSV32_EXTRAS = dict(DSV3_EXTRAS, index_topk=2048, index_head_dim=128, index_n_heads=64)


# --------------------------------------------------------------------------- hybrid linear attn
def qwen3_next(vocab):
    from transformers import Qwen3NextConfig

    # Qwen3-Next-80B-A3B: 3 Gated-DeltaNet layers then 1 gated full-attention layer, partial
    # rotary 0.25, 512 experts top-10 + shared expert (scaled to 8 top-2 + shared)
    return Qwen3NextConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=256,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        decoder_sparse_step=1,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        mlp_only_layers=[],
        layer_types=_layers(4, 8, "linear_attention", "full_attention"),
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        rope_theta=5000000.0,
        partial_rotary_factor=0.25,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


QWEN3_NEXT_EXTRAS = {
    "full_attention_interval": 4,
    "partial_rotary_factor": 0.25,
    "rope_theta": 5000000.0,
    "rope_scaling": None,
    "use_sliding_window": False,
    "attention_bias": False,
}

QWEN35_ROPE = {
    "mrope_interleaved": True,
    "mrope_section": [11, 11, 10],
    "rope_type": "default",
    "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25,
}
QWEN35_TEXT_EXTRAS = {
    "full_attention_interval": 4,
    "attn_output_gate": True,
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
}


def _qwen35_text(vocab, moe: bool):
    common = dict(
        vocab_size=vocab,
        hidden_size=256,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=256,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=_layers(4, 8, "linear_attention", "full_attention"),
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        rope_parameters=dict(QWEN35_ROPE),
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    if moe:
        from transformers import Qwen3_5MoeTextConfig

        # Qwen3.5-35B-A3B: 256 experts top-8 + shared expert (scaled to 8 top-2 + shared)
        return Qwen3_5MoeTextConfig(
            **common,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            num_experts=8,
            num_experts_per_tok=2,
        )
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(**common, intermediate_size=512)


TINY_VISION_QWEN35 = dict(
    depth=1,
    hidden_size=64,
    intermediate_size=128,
    num_heads=2,
    out_hidden_size=256,
    num_position_embeddings=64,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
)


def qwen3_5(vocab):
    return _qwen35_text(vocab, moe=False)


def qwen3_5_moe(vocab):
    return _qwen35_text(vocab, moe=True)


def qwen3_5_vl(vocab):
    from transformers import Qwen3_5Config

    return Qwen3_5Config(
        text_config=_qwen35_text(vocab, False).to_dict(),
        vision_config=dict(TINY_VISION_QWEN35),
        tie_word_embeddings=False,
    )


def qwen3_5_moe_vl(vocab):
    from transformers import Qwen3_5MoeConfig

    return Qwen3_5MoeConfig(
        text_config=_qwen35_text(vocab, True).to_dict(),
        vision_config=dict(TINY_VISION_QWEN35),
        tie_word_embeddings=False,
    )


# --------------------------------------------------------------------------- gemma / llama4
def _gemma3_text(vocab, **over):
    from transformers import Gemma3TextConfig

    # gemma-3-1b-it: 5 local (sliding) layers then 1 global, local theta 1e4, global 1e6,
    # query_pre_attn_scalar = head_dim, sandwich norms, tied embeddings, GeGLU (tanh)
    kw = dict(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=64,
        sliding_window_pattern=6,
        layer_types=_layers(6, 8, "sliding_attention", "full_attention"),
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        rope_scaling=None,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh",
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        tie_word_embeddings=True,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )
    kw.update(over)
    return Gemma3TextConfig(**kw)


GEMMA3_TEXT_EXTRAS = {
    "sliding_window_pattern": 6,
    "rope_local_base_freq": 10000.0,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "query_pre_attn_scalar": 64,
}


def gemma3(vocab):
    return _gemma3_text(vocab)


def gemma3_vl(vocab):
    from transformers import Gemma3Config

    # gemma-3-4b-it: the text model has linear rope scaling x8 on the global layers
    text = _gemma3_text(vocab, rope_scaling={"factor": 8.0, "rope_type": "linear"})
    vision = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=56,
        patch_size=14,
        vision_use_head=False,
        model_type="siglip_vision_model",
    )
    return Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=100,
        eoi_token_index=101,
        image_token_index=102,
        tie_word_embeddings=True,
    )


GEMMA3_VL_TEXT_EXTRAS = dict(
    GEMMA3_TEXT_EXTRAS, rope_scaling={"factor": 8.0, "rope_type": "linear"}
)

LLAMA4_ROPE = {
    "factor": 16.0,
    "high_freq_factor": 1.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def _llama4_text(vocab):
    from transformers import Llama4TextConfig

    # Llama-4-Scout-17B-16E: every layer MoE (16 experts top-1 + shared, scaled to 4),
    # chunked local attention (8192) with every 4th layer NoPE/global, qk-norm on rope
    # layers, attention temperature tuning, llama3 rope x16
    return Llama4TextConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=128,
        intermediate_size_mlp=512,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=4,
        num_experts_per_tok=1,
        interleave_moe_layer_step=1,
        use_qk_norm=True,
        attention_chunk_size=8192,
        no_rope_layer_interval=4,
        attn_temperature_tuning=True,
        floor_scale=8192,
        attn_scale=0.1,
        max_position_embeddings=10485760,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(LLAMA4_ROPE),
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )


# The release's config.json has "attn_temperature_tuning": 4 (an int); transformers 5.19's
# strict Llama4TextConfig refuses it ("Field 'attn_temperature_tuning' expected bool, got int
# (value: 4)"), in AutoConfig and so in SGLang too: a real Llama-4 checkpoint needs that key
# set to true before either loads it. The tiny checkpoint carries true.
LLAMA4_TEXT_EXTRAS = {
    "rope_theta": 500000.0,
    "rope_scaling": dict(LLAMA4_ROPE),
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "for_llm_compressor": False,
    "cache_implementation": "hybrid",
}


def llama4_text(vocab):
    return _llama4_text(vocab)


def llama4(vocab):
    from transformers import Llama4Config

    vision = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=56,
        patch_size=14,
        vision_output_dim=128,
        projector_input_dim=128,
        projector_output_dim=256,
        pixel_shuffle_ratio=0.5,
    )
    return Llama4Config(
        text_config=_llama4_text(vocab).to_dict(),
        vision_config=vision,
        boi_token_index=100,
        eoi_token_index=101,
        image_token_index=102,
        tie_word_embeddings=False,
    )


# --------------------------------------------------------------------------- issue 33's targets
# Smaller than the families above (hidden 128, 4 layers: the fewest `capture_layers` of
# tests/test_families.py takes, 4 experts): each is one more SGLang CPU engine in CI.
def qwen2_moe(vocab):
    from transformers import Qwen2MoeConfig

    # Qwen1.5-MoE-A2.7B / Qwen2-57B-A14B: qkv bias, every layer MoE (decoder_sparse_step 1)
    # with a gated shared expert, top-k not renormalised; 60 experts top-4 scaled to 4 top-2
    return Qwen2MoeConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        qkv_bias=True,
        max_position_embeddings=8192,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        sliding_window=32768,
        use_sliding_window=False,
        max_window_layers=21,
        router_aux_loss_coef=0.001,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


QWEN2_MOE_EXTRAS = {"rope_theta": 1000000.0, "rope_scaling": None, "use_sliding_window": False}

# Qwen3-VL-8B-Instruct's text rope: interleaved M-RoPE (sections scaled to head_dim 64)
QWEN3_VL_ROPE = {
    "mrope_interleaved": True,
    "mrope_section": [12, 10, 10],
    "rope_type": "default",
    "rope_theta": 5000000.0,
}
TINY_VISION_QWEN3_VL = dict(
    depth=2,
    hidden_size=64,
    intermediate_size=128,
    num_heads=2,
    out_hidden_size=128,
    num_position_embeddings=64,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    deepstack_visual_indexes=[0, 1],
)


def _qwen3_vl_text(vocab, moe: bool):
    common = dict(
        vocab_size=vocab,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        rope_parameters=dict(QWEN3_VL_ROPE),
        attention_bias=False,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    if moe:
        from transformers import Qwen3VLMoeTextConfig

        # Qwen3-VL-30B-A3B: every layer MoE, 128 experts top-8 (scaled to 4 top-2), renormalised
        return Qwen3VLMoeTextConfig(
            **common,
            intermediate_size=256,
            moe_intermediate_size=32,  # 2 x 32 != hidden: the saved layout is unambiguous
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    from transformers import Qwen3VLTextConfig

    return Qwen3VLTextConfig(**common, intermediate_size=256)


def qwen3_vl(vocab):
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(
        text_config=_qwen3_vl_text(vocab, False).to_dict(),
        vision_config=dict(TINY_VISION_QWEN3_VL),
        tie_word_embeddings=False,
    )


def qwen3_vl_moe(vocab):
    from transformers import Qwen3VLMoeConfig

    return Qwen3VLMoeConfig(
        text_config=_qwen3_vl_text(vocab, True).to_dict(),
        vision_config=dict(TINY_VISION_QWEN3_VL),
        tie_word_embeddings=False,
    )


def qwen2_5_vl(vocab):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLTextConfig

    # Qwen2.5-VL-7B-Instruct: Qwen2 text model (qkv bias) with M-RoPE sections [16, 24, 24]
    # (scaled to head_dim 64: [8, 12, 12]), theta 1e6; a windowed-attention vision tower
    text = Qwen2_5_VLTextConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128000,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 1e6},
        sliding_window=32768,
        use_sliding_window=False,
        max_window_layers=28,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    vision = dict(
        depth=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=2,
        out_hidden_size=128,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=112,
        fullatt_block_indexes=[1],
        tokens_per_second=2,
    )
    return Qwen2_5_VLConfig(
        text_config=text.to_dict(), vision_config=vision, tie_word_embeddings=False
    )


QWEN2_5_VL_TEXT_EXTRAS = {
    "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
    "rope_theta": 1000000.0,
}

# Ministral-3-8B-Instruct-2512's text model (the release wraps it in
# Mistral3ForConditionalGeneration, whose SGLang class, a Llava wrapper, has no EAGLE-3 capture):
# yarn x16 from 16384 with the Llama-4 attention scaling (beta 0.1), theta 1e6, untied
MINISTRAL3_ROPE = {
    "rope_type": "yarn",
    "factor": 16.0,
    "original_max_position_embeddings": 16384,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.1,
    "rope_theta": 1000000.0,
}


def ministral3(vocab):
    from transformers import Ministral3Config

    return Ministral3Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=262144,
        rms_norm_eps=1e-5,
        rope_parameters=dict(MINISTRAL3_ROPE),
        sliding_window=None,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )


def apertus(vocab):
    from transformers import ApertusConfig

    # Apertus-8B-Instruct-2509: xIELU MLP (no gate), qk-norm, llama3 rope x8, untied
    return ApertusConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=65536,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 12000000.0,
        },
        hidden_act="xielu",
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )


# DeepSeek-V2-Lite: MLA without a q LoRA (the real dims: SGLang's MLA kernels want them), 64
# experts top-6 + 2 shared (scaled to 4 top-2 + 2), greedy softmax routing, first layer dense,
# yarn x40
DSV2_ROPE = {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
}


def deepseek_v2(vocab):
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        vocab_size=vocab,
        hidden_size=512,
        intermediate_size=1024,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=4,
        n_shared_experts=2,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        topk_method="greedy",
        n_group=1,
        topk_group=1,
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
        max_position_embeddings=163840,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=dict(DSV2_ROPE),
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


DSV2_EXTRAS = {
    "moe_layer_freq": 1,
    "scoring_func": "softmax",
    "topk_method": "greedy",
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "rope_theta": 10000.0,
    "rope_scaling": dict(DSV2_ROPE),
    "q_lora_rank": None,
}


def glm4_moe_lite(vocab):
    from transformers import Glm4MoeLiteConfig

    # GLM-4.7-Flash: MLA (q LoRA 768, kv LoRA 512, nope 192, rope 64, v 256), 64 experts top-4
    # + 1 shared (scaled to 4 top-2 + 1), sigmoid routing, first layer dense
    return Glm4MoeLiteConfig(
        vocab_size=vocab,
        hidden_size=512,
        intermediate_size=1024,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=768,
        kv_lora_rank=512,
        qk_nope_head_dim=192,
        qk_rope_head_dim=64,
        v_head_dim=256,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        routed_scaling_factor=1.8,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        mlp_layer_types=["dense"] + ["sparse"] * 3,
        max_position_embeddings=202752,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


GLM4_MOE_LITE_EXTRAS = {
    "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 1,
    "topk_method": "noaux_tc",
    "rope_theta": 1000000.0,
    "rope_scaling": None,
}


def _gemma4_text(vocab):
    from transformers import Gemma4TextConfig

    # gemma-4-e2b-it (transformers' defaults are that checkpoint's): sliding (theta 1e4) and
    # full layers (proportional rope, partial 0.25, theta 1e6) with a wider head on the full
    # ones (global_head_dim), per-layer input embeddings (PLE), the last layers reusing an
    # earlier layer's KV (num_kv_shared_layers) with a double-wide MLP, logit softcap 30, tied
    return Gemma4TextConfig(
        vocab_size=vocab,
        vocab_size_per_layer_input=vocab,
        hidden_size_per_layer_input=32,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        global_head_dim=128,
        sliding_window=64,
        layer_types=["sliding_attention", "full_attention"] * 2,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        final_logit_softcapping=30.0,
        max_position_embeddings=131072,
        rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )


def gemma4(vocab):
    return _gemma4_text(vocab)


def gemma4_vl(vocab):
    from transformers import Gemma4Config

    vision = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        patch_size=16,
        pooling_kernel_size=3,
        position_embedding_size=1024,
    )
    return Gemma4Config(
        text_config=_gemma4_text(vocab).to_dict(),
        vision_config=vision,
        boi_token_id=100,
        eoi_token_id=101,
        image_token_id=102,
        video_token_id=103,
        tie_word_embeddings=True,
    )


def exaone_moe(vocab):
    from transformers import ExaoneMoeConfig

    # K-EXAONE-236B-A23B (transformers' defaults are that checkpoint's): 3 sliding layers then 1
    # global ("LLLG"), first layer dense, 64 experts top-8 + 1 shared (scaled to 4 top-2 + 1),
    # routed scaling 2.5
    return ExaoneMoeConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        sliding_window=64,
        sliding_window_pattern=4,
        first_k_dense_replace=1,
        num_experts=4,
        num_experts_per_tok=2,
        num_shared_experts=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        n_group=1,
        topk_group=1,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )


def mellum(vocab):
    from transformers import MellumConfig

    # Mellum2-12B-A2.5B (transformers' defaults): every layer MoE (64 experts top-8 scaled to 4
    # top-2, renormalised), sliding (1024, theta 1e4) and full (theta 5e5) layers; the
    # sliding/full mix here is 3:1 (the release's own pattern was not read here)
    return MellumConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        sliding_window=64,
        layer_types=_layers(4, 4, "sliding_attention", "full_attention"),
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=131072,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


def glm5_next(vocab):
    from transformers import Glm5NextConfig, Glm5NextTextConfig

    # GLM-5.3-Flash (transformers' defaults are that checkpoint's): 3 linear-attention (KDA)
    # layers then 1 DSA-indexed MLA layer (NoPE, q LoRA), the first 3 layers dense then MoE
    # (288 experts top-8 + 1 shared scaled to 4 top-2 + 1), hyper-connections (hc_mult 4)
    text = Glm5NextTextConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=128,
        kv_lora_rank=512,
        qk_rope_head_dim=0,
        qk_nope_head_dim=256,
        v_head_dim=256,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        index_n_heads=4,
        linear_head_dim=64,
        linear_num_heads=4,
        max_position_embeddings=1048576,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )
    vision = dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=256)
    return Glm5NextConfig(text_config=text.to_dict(), vision_config=vision)


def gemma4_unified(vocab):
    from transformers import Gemma4UnifiedConfig, Gemma4UnifiedTextConfig

    # gemma-4-12B-it (transformers' defaults are that checkpoint's): 5 sliding layers (1024,
    # theta 1e4) then 1 full (proportional rope, partial 0.25, theta 1e6) with its own wider head
    # (global_head_dim), tied; no per-layer embeddings or KV sharing
    text = Gemma4UnifiedTextConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        global_head_dim=128,
        sliding_window=64,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )
    vision = dict(
        patch_size=16,
        pooling_kernel_size=3,
        mm_embed_dim=64,
        mm_posemb_size=64,
        output_proj_dims=64,
    )
    return Gemma4UnifiedConfig(
        text_config=text.to_dict(),
        vision_config=vision,
        boi_token_id=100,
        eoi_token_id=101,
        image_token_id=102,
        video_token_id=103,
        # inside this vocabulary, as the release's are inside its own (SGLang masks eoi/eoa)
        boa_token_id=104,
        eoa_token_index=105,
        audio_token_id=106,
        tie_word_embeddings=True,
    )


FAMILIES: Dict[str, Family] = {
    "llama": Family(
        "LlamaForCausalLM", llama, {"rope_theta": 500000.0, "rope_scaling": dict(LLAMA31_ROPE)}
    ),
    "qwen2": Family("Qwen2ForCausalLM", qwen2, {"rope_theta": 1000000.0, "rope_scaling": None}),
    "qwen3": Family("Qwen3ForCausalLM", qwen3, {"rope_theta": 1000000.0, "rope_scaling": None}),
    "qwen3_moe": Family(
        "Qwen3MoeForCausalLM", qwen3_moe, {"rope_theta": 1000000.0, "rope_scaling": None}
    ),
    "qwen3_next": Family("Qwen3NextForCausalLM", qwen3_next, QWEN3_NEXT_EXTRAS, num_layers=8),
    "qwen3_5": Family(
        "Qwen3_5ForCausalLM",
        qwen3_5,
        QWEN35_TEXT_EXTRAS,
        num_layers=8,
        note="text class; the releases are ...ForConditionalGeneration",
    ),
    "qwen3_5_moe": Family(
        "Qwen3_5MoeForCausalLM", qwen3_5_moe, QWEN35_TEXT_EXTRAS, num_layers=8, note="text class"
    ),
    "qwen3_5_vl": Family(
        "Qwen3_5ForConditionalGeneration", qwen3_5_vl, {}, QWEN35_TEXT_EXTRAS, num_layers=8
    ),
    "qwen3_5_moe_vl": Family(
        "Qwen3_5MoeForConditionalGeneration", qwen3_5_moe_vl, {}, QWEN35_TEXT_EXTRAS, num_layers=8
    ),
    "gpt_oss": Family("GptOssForCausalLM", gpt_oss, GPT_OSS_EXTRAS),
    "glm4_moe": Family("Glm4MoeForCausalLM", glm4_moe, GLM4_MOE_EXTRAS),
    "minimax_m2": Family("MiniMaxM2ForCausalLM", minimax_m2, MINIMAX_M2_EXTRAS),
    "deepseek_v3": Family("DeepseekV3ForCausalLM", deepseek_v3, DSV3_EXTRAS),
    "deepseek_v32": Family("DeepseekV32ForCausalLM", deepseek_v32, DSV32_EXTRAS),
    "gemma3": Family("Gemma3ForCausalLM", gemma3, GEMMA3_TEXT_EXTRAS, num_layers=8),
    "gemma3_vl": Family(
        "Gemma3ForConditionalGeneration",
        gemma3_vl,
        {},
        GEMMA3_VL_TEXT_EXTRAS,
        num_layers=8,
        renames=(("vision_tower.", "vision_tower.vision_model."),),
    ),
    "llama4": Family(
        "Llama4ForConditionalGeneration", llama4, {}, LLAMA4_TEXT_EXTRAS, num_layers=8
    ),
    "llama4_text": Family("Llama4ForCausalLM", llama4_text, LLAMA4_TEXT_EXTRAS, num_layers=8),
    "phi3": Family("Phi3ForCausalLM", phi3, {"rope_theta": 10000.0, "rope_scaling": None}),
    "mistral": Family(
        "MistralForCausalLM", mistral, {"rope_theta": 1000000.0, "rope_scaling": None}
    ),
    "qwen2_moe": Family("Qwen2MoeForCausalLM", qwen2_moe, QWEN2_MOE_EXTRAS, num_layers=4),
    "qwen3_vl": Family("Qwen3VLForConditionalGeneration", qwen3_vl, num_layers=4),
    "qwen3_vl_moe": Family(
        "Qwen3VLMoeForConditionalGeneration",
        qwen3_vl_moe,
        num_layers=4,
        transposed=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
    ),
    "qwen2_5_vl": Family(
        "Qwen2_5_VLForConditionalGeneration", qwen2_5_vl, {}, QWEN2_5_VL_TEXT_EXTRAS, num_layers=4
    ),
    "ministral3": Family(
        "Ministral3ForCausalLM",
        ministral3,
        num_layers=4,
        note="text class; the releases are Mistral3ForConditionalGeneration",
    ),
    "apertus": Family("ApertusForCausalLM", apertus, num_layers=4),
    "deepseek_v2": Family("DeepseekV2ForCausalLM", deepseek_v2, DSV2_EXTRAS, num_layers=4),
    "glm4_moe_lite": Family(
        "Glm4MoeLiteForCausalLM", glm4_moe_lite, GLM4_MOE_LITE_EXTRAS, num_layers=4
    ),
    "gemma4": Family("Gemma4ForCausalLM", gemma4, num_layers=4),
    "gemma4_vl": Family("Gemma4ForConditionalGeneration", gemma4_vl, num_layers=4),
    # the release's config.json lists `is_moe_layer` (SGLang 0.5.23 reads it at load; transformers'
    # config class derives mlp_layer_types instead and does not write it)
    "exaone_moe": Family(
        "ExaoneMoeForCausalLM",
        exaone_moe,
        {"is_moe_layer": [False, True, True, True]},
        num_layers=4,
    ),
    "mellum": Family("MellumForCausalLM", mellum, num_layers=4),
    # GLM-5-next's text_config carries `index_kpool_compress: true` (SGLang 0.5.23's DSA K-pool
    # indexer reads it at load) and `mhc: true` (seen in GLM-5.x test configs in public
    # repositories, not in the release's own file; SGLang's config defaults it to false and then
    # builds plain residuals, dropping the checkpoint's hyper-connection weights: the run of
    # 2026-12-02 without it captured a plain-residual model: docs/performance.md); transformers'
    # config class writes neither (its model always runs the hyper-connections)
    "glm5_next": Family(
        "Glm5NextForConditionalGeneration",
        glm5_next,
        num_layers=4,
        text_extras={"index_kpool_compress": True, "mhc": True},
    ),
    # SGLang's encoder-free vision embedder reads `model_patch_size` (patch_size x
    # pooling_kernel_size: 48 in gemma-4-12B-it), which transformers' config does not write
    "gemma4_unified": Family(
        "Gemma4UnifiedForConditionalGeneration",
        gemma4_unified,
        num_layers=4,
        vision_extras={"model_patch_size": 48},
    ),
}


def families_dir():
    from hsdump.tiny import cache_dir

    return cache_dir() / "families"


def _merge(d: dict, extras: dict) -> None:
    for k, v in extras.items():
        d[k] = v


def _rename_weights(path: Path, renames, transposed=()) -> None:
    from safetensors.torch import load_file, save_file

    w = load_file(path)
    out = {}
    for k, v in w.items():
        for old, new in renames:
            if k.startswith(old) and not k.startswith(new):
                k = new + k[len(old) :]
                break
        if k.endswith(tuple(transposed)):
            v = v.transpose(-1, -2).contiguous()
        out[k] = v
    save_file(out, path, metadata={"format": "pt"})


def _stale(config_file: Path, fam) -> bool:
    """A cached checkpoint whose config.json lacks a field the family now adds (extras,
    text_extras, vision_extras: the fields real config.json files carry)."""
    raw = json.loads(config_file.read_text())

    def lacks(have: dict, want: dict) -> bool:  # as _merge wrote them, through JSON
        return any(have.get(k) != v for k, v in json.loads(json.dumps(want)).items())

    return (
        raw.get("architectures") != [fam.cls]
        or lacks(raw, fam.extras or {})
        or lacks(raw.get("text_config") or {}, fam.text_extras or {})
        or lacks(raw.get("vision_config") or {}, fam.vision_extras or {})
    )


def build(name: str, dest: Optional[Path] = None, seed: int = 0, force: bool = False) -> Path:
    """The family's checkpoint folder (built on first use, then cached)."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from hsdump.tiny import save_tokenizer

    fam = FAMILIES[name]
    dest = Path(dest) if dest else families_dir() / name
    if (dest / "config.json").exists() and not force:
        if not _stale(dest / "config.json", fam):
            return dest
        force = True  # built before the family's config fields changed
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        save_tokenizer(tmp)
        vocab = len(AutoTokenizer.from_pretrained(tmp))
        cfg = fam.config(vocab)
        cfg.architectures = [fam.cls]
        torch.manual_seed(seed)
        model = getattr(transformers, fam.cls)(cfg).to(torch.bfloat16).eval()
        model.save_pretrained(tmp)
        if fam.renames or fam.transposed:
            _rename_weights(tmp / "model.safetensors", fam.renames, fam.transposed)
        cfg_file = tmp / "config.json"
        raw = json.loads(cfg_file.read_text())
        _merge(raw, fam.extras)
        if fam.text_extras:
            _merge(raw.setdefault("text_config", {}), fam.text_extras)
        if fam.vision_extras:
            _merge(raw.setdefault("vision_config", {}), fam.vision_extras)
        raw["architectures"] = [fam.cls]
        raw["torch_dtype"] = "bfloat16"
        cfg_file.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
        if dest.exists() and force:
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def extract_overrides(ckpt, fam_name: str, layers, device: str, samples: int) -> list:
    """extract.py's overrides for a family's checkpoint (tests/test_families.py and the family
    probe, bench/families_probe.py): its own tokenizer, the DeepSeek-V3 template, `layers`
    captured whatever the family gate says, `samples` of the embedded data, engine=`device`."""
    return [
        f"model.path={ckpt}",
        f"model.tokenizer={ckpt}",
        f"model.name=probe-{fam_name}",
        "model.chat_template=deepseek_v3.jinja",
        "model.default_layers=null",
        f"capture.layers=[{','.join(map(str, layers))}]",
        "capture.allow_unverified=true",
        f"dataset.max_samples={samples}",
        "output.overwrite=true",
        f"engine={device}",
        "engine.log_level=info",
    ]


if __name__ == "__main__":
    for n in sys.argv[1:] or FAMILIES:
        print(n, build(n))
