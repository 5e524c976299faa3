"""`FAMILIES`: every family by name, its transformers class (the checkpoint's
`architectures[0]`), its config function and the raw config.json keys the release carries."""

from __future__ import annotations

from typing import Dict

from hsdump.testing.families.base import Family
from hsdump.testing.families.dense import (
    LLAMA31_ROPE,
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
    QWEN35_TEXT_EXTRAS,
    qwen3_5,
    qwen3_5_moe,
    qwen3_5_moe_vl,
    qwen3_5_vl,
    qwen3_next,
)
from hsdump.testing.families.mla import (
    DSV2_EXTRAS,
    DSV3_EXTRAS,
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
    LLAMA4_TEXT_EXTRAS,
    QWEN2_5_VL_TEXT_EXTRAS,
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
