"""Families with a vision tower, and the text classes built from the same text model:
Gemma-3, Llama-4, and issue 33's Qwen3-VL (dense and MoE), Qwen2.5-VL, Gemma-4 (text and
multimodal) and Gemma-4 unified."""

from __future__ import annotations

from hsdump.testing.families.base import BOS, EOS, _layers


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


# issue 33's targets: smaller than the families above (hidden 128, 4 layers: the fewest
# `capture_layers` of tests/test_families.py takes, 4 experts): each is one more SGLang CPU
# engine in CI
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
