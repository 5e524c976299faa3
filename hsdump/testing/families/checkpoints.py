"""Building a family's checkpoint (cached by name, rebuilt when the family's config fields
changed) and extract.py's overrides for it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from hsdump.testing.families.registry import FAMILIES


def families_dir():
    from hsdump.tiny import cache_dir

    return cache_dir() / "families"


def _merge(d: dict, extras: dict) -> None:
    for k, v in extras.items():
        d[k] = v


def _rename_weights(path: Path, renames, transposed=()) -> None:
    from safetensors.torch import load_file, save_file

    w = load_file(path)
    out = {}
    for k, v in w.items():
        for old, new in renames:
            if k.startswith(old) and not k.startswith(new):
                k = new + k[len(old) :]
                break
        if k.endswith(tuple(transposed)):
            v = v.transpose(-1, -2).contiguous()
        out[k] = v
    save_file(out, path, metadata={"format": "pt"})


def _stale(config_file: Path, fam) -> bool:
    """A cached checkpoint whose config.json lacks a field the family now adds (extras,
    text_extras, vision_extras: the fields real config.json files carry)."""
    raw = json.loads(config_file.read_text())

    def lacks(have: dict, want: dict) -> bool:  # as _merge wrote them, through JSON
        return any(have.get(k) != v for k, v in json.loads(json.dumps(want)).items())

    return (
        raw.get("architectures") != [fam.cls]
        or lacks(raw, fam.extras or {})
        or lacks(raw.get("text_config") or {}, fam.text_extras or {})
        or lacks(raw.get("vision_config") or {}, fam.vision_extras or {})
    )


def build(name: str, dest: Optional[Path] = None, seed: int = 0, force: bool = False) -> Path:
    """The family's checkpoint folder (built on first use, then cached)."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from hsdump.tiny import save_tokenizer

    fam = FAMILIES[name]
    dest = Path(dest) if dest else families_dir() / name
    if (dest / "config.json").exists() and not force:
        if not _stale(dest / "config.json", fam):
            return dest
        force = True  # built before the family's config fields changed
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        save_tokenizer(tmp)
        vocab = len(AutoTokenizer.from_pretrained(tmp))
        cfg = fam.config(vocab)
        cfg.architectures = [fam.cls]
        torch.manual_seed(seed)
        model = getattr(transformers, fam.cls)(cfg).to(torch.bfloat16).eval()
        model.save_pretrained(tmp)
        if fam.renames or fam.transposed:
            _rename_weights(tmp / "model.safetensors", fam.renames, fam.transposed)
        cfg_file = tmp / "config.json"
        raw = json.loads(cfg_file.read_text())
        _merge(raw, fam.extras)
        if fam.text_extras:
            _merge(raw.setdefault("text_config", {}), fam.text_extras)
        if fam.vision_extras:
            _merge(raw.setdefault("vision_config", {}), fam.vision_extras)
        raw["architectures"] = [fam.cls]
        raw["torch_dtype"] = "bfloat16"
        cfg_file.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
        if dest.exists() and force:
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def extract_overrides(ckpt, fam_name: str, layers, device: str, samples: int) -> list:
    """extract.py's overrides for a family's checkpoint (tests/test_families.py and the family
    probe, bench/families_probe.py): its own tokenizer, the DeepSeek-V3 template, `layers`
    captured whatever the family gate says, `samples` of the embedded data, engine=`device`."""
    return [
        f"model.path={ckpt}",
        f"model.tokenizer={ckpt}",
        f"model.name=probe-{fam_name}",
        "model.chat_template=deepseek_v3.jinja",
        "model.default_layers=null",
        f"capture.layers=[{','.join(map(str, layers))}]",
        "capture.allow_unverified=true",
        f"dataset.max_samples={samples}",
        "output.overwrite=true",
        f"engine={device}",
        "engine.log_level=info",
    ]
