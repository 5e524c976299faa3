"""A tiny Kimi-K2.5 checkpoint laid out as the real one is (`python tests/kimi_checkpoint.py DEST
[--int4]` builds one by hand).

What the real moonshotai/Kimi-K2.5 holds (its config.json and weight index, read 2026-12-01):
- config.json: `architectures: [KimiK25ForConditionalGeneration]`, `model_type: kimi_k25`, the
  DeepSeek-V3 text model under `text_config` (MLA, sigmoid-scored routed experts with a
  correction bias, one shared expert, the first layer dense, yarn rope), MoonViT under
  `vision_config` with its `vt_*` names, and `quantization_config` (compressed-tensors,
  pack-quantized INT4, group 32, symmetric; attention, shared experts, dense MLPs and lm_head
  ignored) at the top level and again inside `text_config`;
- weights: `language_model.model.*`, `language_model.lm_head.weight`, `vision_tower.*`,
  `mm_projector.*`; each routed expert's projection as `weight_packed` (int32, 8 values a word),
  `weight_scale` (bf16, one per 32 inputs) and `weight_shape`;
- the tokenizer: `tiktoken.model` + `tokenizer_config.json` (+ Python code hsdump does not run).

The text model is built with transformers' own DeepseekV3 classes, which are also the reference
(`reference_dir`: the same text weights as a DeepseekV3ForCausalLM folder; for an INT4
checkpoint, the experts there are the dequantized INT4 values). transformers 5.19's
Kimi_K25 classes save other names than the real checkpoint (`language_model.model.blocks.*`,
`model.mm_projector.*`), so the wrapper's names come from the real weight index instead, and
the vision tower's weights are random tensors of the real names and shapes (a text-only capture
never runs them; SGLang still loads them).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

GROUP = 32

# the real checkpoint's quantization_config (Kimi-K2.5 config.json)
QUANTIZATION_CONFIG = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": GROUP,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    ],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}

# MoonViT, one block, small widths, the real field names (the real: 27 blocks of 1152)
VISION = {
    "init_pos_emb_height": 8,
    "init_pos_emb_time": 4,
    "init_pos_emb_width": 8,
    "merge_kernel_size": [2, 2],
    "merge_type": "sd2_tpool",
    "mm_hidden_size": 64,
    "mm_projector_type": "patchmerger",
    "model_type": "",
    "patch_size": 14,
    "pos_emb_type": "divided_fixed",
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-05,
    "video_attn_type": "spatial_temporal",
    "vt_hidden_size": 64,
    "vt_intermediate_size": 128,
    "vt_num_attention_heads": 2,
    "vt_num_hidden_layers": 1,
    # SGLang's KimiK25VisionConfig reads the plain names and defaults them to the real
    # model's sizes (1152, 4304, 16, 27), which the real config's vt_* equal: a smaller
    # tower needs them said twice
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
}


def text_config(vocab_size: int, num_layers: int = 6, bos: int = 0, eos: int = 1, pad: int = 0):
    """Kimi-K2.5's text config at small widths: the real MLA head dims (the GPU's MLA kernels
    need them), 8 routed experts top-2 plus one shared, layer 0 dense, sigmoid + noaux_tc
    routing, yarn rope."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=512,
        intermediate_size=1024,
        moe_intermediate_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        routed_scaling_factor=2.827,
        kv_lora_rank=512,
        q_lora_rank=256,
        qk_rope_head_dim=64,
        v_head_dim=128,
        qk_nope_head_dim=128,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        max_position_embeddings=262144,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        rope_parameters={
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 64.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "rope_theta": 50000.0,
            "rope_type": "yarn",
            "type": "yarn",
        },
        torch_dtype="bfloat16",
    )


def quantize_int4(w: torch.Tensor):
    """Symmetric INT4, one scale per 32 inputs, packed by compressed-tensors' own packer:
    (weight_packed int32 [out, in / 8], weight_scale bf16 [out, in / 32], the dequantized
    weight in w's dtype)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    out_f, in_f = w.shape
    g = w.float().reshape(out_f, in_f // GROUP, GROUP)
    scale = (g.abs().amax(dim=-1, keepdim=True) / 7).clamp(min=1e-8).to(torch.bfloat16)
    q = torch.clamp(torch.round(g / scale.float()), -8, 7)
    deq = (q * scale.float()).reshape(out_f, in_f).to(w.dtype)
    packed = pack_to_int32(q.reshape(out_f, in_f).to(torch.int8), 4)
    return packed, scale.squeeze(-1).contiguous(), deq


def _vision_weights(gen: torch.Generator, text_hidden: int) -> dict:
    h, inter = VISION["vt_hidden_size"], VISION["vt_intermediate_size"]
    hm = VISION["mm_hidden_size"] * 4  # 2 x 2 merge

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    w = {
        "vision_tower.patch_embed.proj.weight": rnd(h, 3, 14, 14),
        "vision_tower.patch_embed.proj.bias": rnd(h),
        "vision_tower.patch_embed.pos_emb.weight": rnd(
            VISION["init_pos_emb_height"], VISION["init_pos_emb_width"], h
        ),
        "vision_tower.encoder.final_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "vision_tower.encoder.final_layernorm.bias": rnd(h),
        "mm_projector.pre_norm.weight": torch.ones(VISION["mm_hidden_size"], dtype=torch.bfloat16),
        "mm_projector.pre_norm.bias": rnd(VISION["mm_hidden_size"]),
        "mm_projector.proj.0.weight": rnd(hm, hm),
        "mm_projector.proj.0.bias": rnd(hm),
        "mm_projector.proj.2.weight": rnd(text_hidden, hm),
        "mm_projector.proj.2.bias": rnd(text_hidden),
    }
    for i in range(VISION["vt_num_hidden_layers"]):
        p = f"vision_tower.encoder.blocks.{i}."
        w.update(
            {
                p + "wqkv.weight": rnd(3 * h, h),
                p + "wqkv.bias": rnd(3 * h),
                p + "wo.weight": rnd(h, h),
                p + "wo.bias": rnd(h),
                p + "mlp.fc0.weight": rnd(inter, h),
                p + "mlp.fc0.bias": rnd(inter),
                p + "mlp.fc1.weight": rnd(h, inter),
                p + "mlp.fc1.bias": rnd(h),
                p + "norm0.weight": torch.ones(h, dtype=torch.bfloat16),
                p + "norm0.bias": rnd(h),
                p + "norm1.weight": torch.ones(h, dtype=torch.bfloat16),
                p + "norm1.bias": rnd(h),
            }
        )
    return w


def _is_routed_expert(name: str) -> bool:
    return ".mlp.experts." in name and name.endswith("_proj.weight")


def build(
    dest: Path, write_tokenizer, int4: bool = False, num_layers: int = 6, seed: int = 0
) -> Path:
    """Write a tiny Kimi-K2.5 checkpoint to dest, and its reference (a DeepseekV3ForCausalLM
    folder of the same text weights, dequantized where INT4) to reference_dir(dest).
    write_tokenizer(folder) writes the tokenizer files and returns (vocab size, bos, eos)."""
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3ForCausalLM

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        vocab, bos, eos = write_tokenizer(tmp)
        cfg = text_config(vocab, num_layers, bos=bos, eos=eos, pad=bos)
        torch.manual_seed(seed)
        model = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).eval()
        # random init leaves the routing bias at 0 and the norms at 1: vary them, as trained
        # weights do, so a wrong layer or a wrong expert shows
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            for layer in model.model.layers[cfg.first_k_dense_replace :]:
                bias = layer.mlp.gate.e_score_correction_bias
                bias.copy_(0.01 * torch.randn(bias.shape, generator=gen))
        # transformers fuses the experts in memory and saves them one by one, as checkpoints
        # hold them: read the saved names back
        ref = tmp / "reference"
        model.save_pretrained(ref)
        state = load_file(str(ref / "model.safetensors"))
        wrapper = {}
        for name, w in state.items():
            real = "language_model." + name  # model.* -> language_model.model.*, lm_head too
            if int4 and _is_routed_expert(name):
                packed, scale, deq = quantize_int4(w)
                stem = real[: -len(".weight")]
                wrapper[stem + ".weight_packed"] = packed
                wrapper[stem + ".weight_scale"] = scale
                wrapper[stem + ".weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int32)
                state[name] = deq
            else:
                wrapper[real] = w
        if int4:  # the reference holds the values the INT4 weights stand for
            save_file(state, str(ref / "model.safetensors"), metadata={"format": "pt"})
        wrapper.update(_vision_weights(gen, cfg.hidden_size))
        save_file(wrapper, str(tmp / "model.safetensors"), metadata={"format": "pt"})

        text = cfg.to_dict()
        text.update(
            architectures=["DeepseekV3ForCausalLM"],
            model_type="deepseek_v3",
            moe_layer_freq=1,
            scoring_func="sigmoid",
            topk_method="noaux_tc",
            seq_aux=True,
            aux_loss_alpha=0.001,
            ep_size=1,
            num_nextn_predict_layers=0,
            dtype="bfloat16",
            rope_theta=50000.0,
        )
        top = {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "model_type": "kimi_k25",
            "bos_token_id": bos,
            "eos_token_id": eos,
            "pad_token_id": bos,
            "dtype": "bfloat16",
            "ignore_index": -100,
            "media_placeholder_token_id": vocab - 1,
            "tie_word_embeddings": False,
            "use_unified_vision_chunk": True,
            "video_placeholder": "<|kimi_k25_video_placeholder|>",
            "text_config": text,
            "vision_config": dict(VISION, text_hidden_size=cfg.hidden_size),
        }
        if int4:
            top["quantization_config"] = text["quantization_config"] = QUANTIZATION_CONFIG
        (tmp / "config.json").write_text(json.dumps(top, indent=2))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def reference_dir(dest) -> str:
    return str(Path(dest) / "reference")


def write_kimi_tokenizer(folder: Path):
    """Kimi's tokenizer files (tiktoken.model + tokenizer_config.json, hsdump's deterministic
    small vocabulary): (vocab size with the added tokens, [BOS] id, [EOS] id)."""
    from hsdump.corpus.tiktoken_tokenizer import (
        CONFIG_FILE,
        TIKTOKEN_FILE,
        build_kimi_tokenizer,
        write_kimi_style_tokenizer,
    )

    write_kimi_style_tokenizer(folder)
    tok = build_kimi_tokenizer(folder / TIKTOKEN_FILE, folder / CONFIG_FILE)
    return len(tok), tok.convert_tokens_to_ids("[BOS]"), tok.convert_tokens_to_ids("[EOS]")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    out = Path(sys.argv[1])
    build(out, write_kimi_tokenizer, int4="--int4" in sys.argv)
    print(out)


def preset_checkpoint(dest: Path, int4: bool) -> Path:
    """The tiny Kimi-K2.5 checkpoint at 61 layers, with the chat template the release ships
    beside tokenizer_config.json (`model=kimi_k25 model.path=<ckpt>` takes the checkpoint's own)."""
    from hsdump.corpus.chat import template_path

    if not (dest / "config.json").exists():
        build(dest, write_kimi_tokenizer, int4=int4, num_layers=61)
    if not (dest / "chat_template.jinja").exists():
        (dest / "chat_template.jinja").write_text(template_path("kimi_k25.jinja").read_text())
    return dest
