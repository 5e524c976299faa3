"""Mixture-of-experts families without MLA: Qwen3-MoE, GPT-OSS, GLM-4.5 (MoE), MiniMax-M2,
and issue 33's Qwen1.5/2-MoE, K-EXAONE and Mellum."""

from __future__ import annotations

from hsdump.testing.families.base import BOS, EOS, _layers


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


# issue 33's targets: smaller than the families above (hidden 128, 4 layers: the fewest
# `capture_layers` of tests/test_families.py takes, 4 experts): each is one more SGLang CPU
# engine in CI
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
