"""Hybrid linear-attention families (Gated-DeltaNet layers between full-attention ones):
Qwen3-Next, and Qwen3.5 (dense and MoE; text classes and the multimodal releases)."""

from __future__ import annotations

from hsdump.testing.families.base import BOS, EOS, _layers


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
