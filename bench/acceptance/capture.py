"""hsdump's captures as the pipelines run them: extract.py's overrides they share, the
layer-off control's layers, and extract.py with hsdump's tokenizer/template check off (the only
way to make the wrong-template control's data)."""

from __future__ import annotations

WRONG_TEMPLATE = "deepseek_v3.jinja"  # EAGLE-3's template control (the speculators pipeline's)


def extract_unchecked(overrides) -> int:
    """extract.py with hsdump's tokenizer/template check switched off: the only way to make
    the wrong-template control's data, which that check exists to refuse. Everything else
    (tokenization, masks, engine, capture, store) is hsdump's own code path."""
    import hsdump.pipeline as pipeline
    from hsdump.cli import extract

    pipeline.check_tokenizer = lambda *a, **k: None
    return extract(list(overrides))  # `hsdump extract OVERRIDES...`


def capture_args(model: list, cpu: bool, max_length: int) -> list:
    """extract.py's overrides every capture of these runs shares (the kinds and layers, the
    data and the output are each capture's own)."""
    return [*model, "engine=cpu" if cpu else "engine=gpu", f"dataset.max_seq_len={max_length}",
            "dataset.on_bad_row=skip", "dataset.num_proc=8", "output.overwrite=false",
            "progress=false", *([] if cpu else ["engine.mem_fraction_static=0.9"])]  # fmt: skip


def off_by_one(layers) -> list:
    return [int(k) + 1 for k in layers]
