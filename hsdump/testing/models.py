"""The model shapes the GPU tests and the benchmarks run, as transformers configs, and their
checkpoints (random bf16 weights, or config.json alone for SGLang's `load_format=dummy`).

| name | what |
| --- | --- |
| `llama-small` | Llama, hidden 256, 4 heads, 2 KV heads (the GPU fidelity tests) |
| `dsv3-small` | DeepSeek-V3 / Kimi-K2 architecture with the real MLA dims (SGLang's triton MLA kernels do not compile for smaller ones), 8 experts top-2, hidden 512 |
| `llama8b` | Llama-3.1-8B's shape |
| `kimi-width` | DeepSeek-V3 at Kimi-K2.5's widths (its text_config), fewer layers and experts |

    path = build("dsv3-small", dest, num_layers=8)
    path = build("llama8b", dest, weights="dummy")     # config.json only
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable, Dict, Optional

from hsdump.errors import Refusal

VOCAB = 32000
NUM_LAYERS = 6
WEIGHTS = ("files", "dummy")


def llama_small(num_layers: int = NUM_LAYERS, vocab: int = VOCAB):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )


# keys of the real DeepSeek-V3 / Kimi-K2 config.json that SGLang's deepseek_v2 reads and
# transformers' DeepseekV3Config does not define (kept as extra keys in config.json)
DSV3_KEYS = dict(
    moe_layer_freq=1,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    ep_size=1,
    seq_aux=True,
    aux_loss_alpha=0.001,
)


def _deepseek_v3(**kw):
    """DeepseekV3Config with the real model's MLA dims (SGLang's MLA kernels do not compile for
    smaller ones), one shared expert, the first layer dense, sigmoid noaux_tc routing in one
    group, untied embeddings; `kw` the widths and the rest."""
    from transformers import DeepseekV3Config

    mla = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
    routing = dict(n_group=1, topk_group=1, norm_topk_prob=True, first_k_dense_replace=1)
    return DeepseekV3Config(
        n_shared_experts=1, tie_word_embeddings=False, **mla, **routing, **DSV3_KEYS, **kw
    )


def dsv3_small(num_layers: int = NUM_LAYERS, vocab: int = VOCAB, hidden: int = 512):
    """DeepSeek-V3 / Kimi-K2 architecture with the real model's MLA dims and a small MoE."""
    return _deepseek_v3(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        routed_scaling_factor=2.5,
        q_lora_rank=1536,
        max_position_embeddings=163840,
        rope_scaling={
            "type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "rope_theta": 10000.0,
        },
        bos_token_id=0,
        eos_token_id=1,
    )


def llama8b(num_layers: int = 32, vocab: int = 128256):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=num_layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=128001,
    )


def kimi_width(num_layers: int = 8, vocab: int = 163840, experts: int = 16, top_k: int = 8):
    """DeepSeek-V3 architecture at Kimi-K2.5's widths (its text_config: hidden 7168, q_lora 1536,
    kv_lora 512, qk_nope 128, qk_rope 64, v_head 128, 64 heads, expert width 2048, dense width
    18432, 1 shared expert, first layer dense, sigmoid noaux_tc routing with n_group 1, yarn rope
    x64 from 4,096, vocab 163840); fewer layers (61 there) and routed experts (384 there, top-8),
    so that it fits one GPU. Each MoE layer runs as many experts per token as Kimi's (8 + 1)."""
    return _deepseek_v3(
        vocab_size=vocab,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=num_layers,
        num_attention_heads=64,
        num_key_value_heads=64,
        n_routed_experts=experts,
        num_experts_per_tok=top_k,
        routed_scaling_factor=2.827,
        q_lora_rank=1536,
        max_position_embeddings=262144,
        rms_norm_eps=1e-5,
        rope_scaling={
            "type": "yarn",
            "factor": 64.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "rope_theta": 50000.0,
        },
        num_nextn_predict_layers=0,
        bos_token_id=163584,
        eos_token_id=163585,
    )


MODELS: Dict[str, Callable] = {
    "llama-small": llama_small,
    "dsv3-small": dsv3_small,
    "llama8b": llama8b,
    "kimi-width": kimi_width,
}
ARCHITECTURE = {
    "llama-small": "LlamaForCausalLM",
    "dsv3-small": "DeepseekV3ForCausalLM",
    "llama8b": "LlamaForCausalLM",
    "kimi-width": "DeepseekV3ForCausalLM",
}


def config(name: str, **kw):
    """The transformers config of `name` (keyword arguments: num_layers, vocab, ...)."""
    if name not in MODELS:
        raise Refusal(f"unknown model {name!r}; use one of {', '.join(MODELS)}")
    cfg = MODELS[name](**kw)
    cfg.architectures = [ARCHITECTURE[name]]
    return cfg


def build(
    name: str,
    dest,
    weights: str = "files",
    seed: int = 0,
    tokenizer: bool = False,
    device: Optional[str] = None,
    **kw,
) -> str:
    """The checkpoint of `name` in `dest`, reused when dest already holds one. weights="files":
    random bf16 weights (seed `seed`, built on `device`, default the CPU); "dummy": config.json
    only (SGLang's load_format=dummy fills the weights). tokenizer=True: the DeepSeek tokenizer
    with hsdump's DeepSeek-V3 template beside it (hsdump.tiny.save_tokenizer), and the
    vocabulary its length. `kw` goes to the config (num_layers, ...)."""
    import torch
    from transformers import AutoModelForCausalLM

    if weights not in WEIGHTS:
        raise Refusal(f"weights={weights!r}: use one of {WEIGHTS}")
    dest = Path(dest)
    if (dest / "config.json").exists():
        return str(dest)
    tmp = Path(f"{dest}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if tokenizer:
        from transformers import AutoTokenizer

        from hsdump.tiny import save_tokenizer

        save_tokenizer(tmp)
        kw["vocab"] = len(AutoTokenizer.from_pretrained(tmp))
    cfg = config(name, **kw)
    if weights == "dummy":
        cfg.save_pretrained(tmp)
        raw = json.loads((tmp / "config.json").read_text())
        raw["torch_dtype"] = raw["dtype"] = "bfloat16"
        (tmp / "config.json").write_text(json.dumps(raw, indent=1))
    else:
        torch.manual_seed(seed)
        with torch.device(device or "cpu"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(tmp)
        del model
    os.replace(tmp, dest)
    return str(dest)


# the benchmarks' builds (bench/bench.py, bench/reference_capture.py speed): dsv3-small at 8
# layers; llama-small at 8, where its EAGLE-3 default layers are three distinct ones ([2, 4, 5])
BENCH_KW = {"dsv3-small": {"num_layers": 8}, "llama-small": {"num_layers": 8}}


def bench_ids(n: int, seq: int, vocab: int):
    """The `n` prompts of `seq` random ids (generator seeded 1234 + seq, ids 10 .. vocab - 1)
    that bench/bench.py times at a fixed length, and bench/reference_capture.py speed gives
    SpecForge's capture to time the same prompts."""
    import torch

    g = torch.Generator().manual_seed(1234 + seq)
    return [torch.randint(10, vocab, (seq,), generator=g).tolist() for _ in range(n)]


def prompts(lens, seed: int = 0, vocab: int = VOCAB):
    """Random token ids (2 .. vocab - 1), one list per length in `lens`."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lens]
