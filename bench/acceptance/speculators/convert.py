"""A speculators EAGLE-3 checkpoint in SGLang's LlamaForCausalLMEagle3 layout
(`python3 -m bench.acceptance.speculators convert`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

DEFAULT_LAYERS = [2, 15, 27]  # EAGLE-3's [2, L // 2, L - 3] for L = 30 (docs/layers.md)
OFF_LAYERS = [3, 16, 28]


# speculators' Eagle3DraftModel state dict -> the names SGLang 0.5.17's
# LlamaForCausalLMEagle3.load_weights maps onto its modules (it ignores names it does not
# know, silently, so `convert` checks every tensor against EXPECTED below)
RENAME = {"layers.0.": "midlayer."}
DROP = ("verifier_lm_head.", "verifier_norm.", "t2d")
EXPECTED = {
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "embed_tokens.weight",
}
OPTIONAL = {"input_norm.weight", "d2t"}


def epochs(save: Path) -> list:
    """The epochs speculators' trainer saved under --save-path (`<epoch>/` with its config)."""
    if not save.is_dir():
        return []
    return sorted(int(p.name) for p in save.glob("[0-9]*") if (p / "config.json").exists())


def last_checkpoint(save: Path) -> Path:
    """The newest epoch folder speculators wrote under --save-path (`<epoch>/`)."""
    epochs = sorted(
        (int(p.name), p)
        for p in save.iterdir()
        if p.name.isdigit() and (p / "config.json").exists() and any(p.glob("*.safetensors"))
    )
    if not epochs:
        raise SystemExit(f"{save}: no checkpoint")
    return epochs[-1][1]


def convert(ckpt: str, out: str, aux_layers=DEFAULT_LAYERS) -> dict:
    """A speculators EAGLE-3 checkpoint -> a folder SGLang 0.5.17 serves as
    `LlamaForCausalLMEagle3`. `aux_layers` are hsdump's indices (transformers'
    hidden_states[k]); SGLang's eagle_aux_hidden_state_layer_ids are shifted by one (its
    llama adds 1: docs/layers.md), so [2, 15, 27] is written as [1, 14, 26]."""
    import torch
    from safetensors.torch import load_file, save_file

    src = Path(ckpt)
    if src.name.isdigit() is False and (src / "config.json").exists() is False:
        src = last_checkpoint(src)
    elif not (src / "config.json").exists():
        src = last_checkpoint(src)
    scfg = json.loads((src / "config.json").read_text())
    tl = scfg["transformer_layer_config"]
    sd = {}
    for f in sorted(src.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    w = {}
    for k, v in sd.items():
        if k.startswith(DROP):
            continue
        for a, b in RENAME.items():
            k = k.replace(a, b)
        w[k] = v.contiguous()
    unknown = set(w) - EXPECTED - OPTIONAL
    missing = EXPECTED - set(w)
    if unknown or missing:
        raise SystemExit(f"{src}: unknown tensors {sorted(unknown)}, missing {sorted(missing)}")
    if scfg.get("norm_before_residual"):
        raise SystemExit(
            "norm_before_residual=True: SGLang 0.5.17's first draft layer adds the un-normed "
            "hidden state (train with --no-norm-before-residual)"
        )
    if tl.get("num_hidden_layers", 1) != 1:
        raise SystemExit("only one-layer drafters map onto SGLang's LlamaForCausalLMEagle3")
    for k in list(w):
        if k != "d2t" and w[k].is_floating_point():
            w[k] = w[k].to(torch.bfloat16)
    if "d2t" in w:
        w["d2t"] = w["d2t"].to(torch.int64)
    draft_vocab = int(w["lm_head.weight"].shape[0])
    rope = tl.get("rope_parameters") or {}
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": tl["hidden_size"],
        "intermediate_size": tl["intermediate_size"],
        "num_attention_heads": tl["num_attention_heads"],
        "num_key_value_heads": tl["num_key_value_heads"],
        "head_dim": tl.get("head_dim") or tl["hidden_size"] // tl["num_attention_heads"],
        "num_hidden_layers": 1,
        "hidden_act": tl.get("hidden_act", "silu"),
        "rms_norm_eps": tl["rms_norm_eps"],
        "max_position_embeddings": tl["max_position_embeddings"],
        "rope_theta": rope.get("rope_theta", tl.get("rope_theta", 10000.0)),
        "rope_parameters": rope or None,
        "vocab_size": tl["vocab_size"],
        "draft_vocab_size": draft_vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "mlp_bias": False,
        "norm_output": bool(scfg.get("norm_output")),
        "norm_before_fc": bool(scfg.get("norm_before_fc")),
        "eagle_config": {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": [int(k) - 1 for k in aux_layers],
            "norm_before_fc": bool(scfg.get("norm_before_fc")),
        },
    }
    if bool(scfg.get("norm_before_fc")) != ("input_norm.weight" in w):
        raise SystemExit("norm_before_fc and input_norm.weight disagree")
    if scfg.get("fc_norm"):
        raise SystemExit("fc_norm drafters are not mapped here")
    dest = Path(out)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(w, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    info = dict(
        source=str(src),
        tensors=len(w),
        draft_vocab_size=draft_vocab,
        sglang_layer_ids=cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
    )
    (dest / "converted_from.json").write_text(json.dumps(info, indent=1) + "\n")
    return info
