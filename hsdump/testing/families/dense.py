"""Dense text families: Llama-3.1, Qwen2.5, Qwen3, Phi-3, Mistral, and issue 33's
Ministral-3 (text model) and Apertus."""

from __future__ import annotations

from hsdump.testing.families.base import BOS, EOS

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


# issue 33's targets: smaller than the families above (hidden 128, 4 layers: the fewest
# `capture_layers` of tests/test_families.py takes, 4 experts): each is one more SGLang CPU
# engine in CI

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
