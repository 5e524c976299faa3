"""DeepSeek-style multi-head latent attention (MLA, at the real dims: SGLang's MLA kernels do
not compile for smaller ones): DeepSeek-V3, DeepSeek-V3.2 (its lightning indexer), and issue
33's DeepSeek-V2-Lite, GLM-4.7-Flash and GLM-5.3-Flash (MLA layers between linear ones)."""

from __future__ import annotations

from hsdump.testing.families.base import BOS, EOS

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


# issue 33's targets: smaller than the families above (hidden 128, 4 layers: the fewest
# `capture_layers` of tests/test_families.py takes, 4 experts): each is one more SGLang CPU
# engine in CI
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
