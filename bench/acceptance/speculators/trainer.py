"""speculators 0.9.0's own EAGLE-3 trainer, configured by its own CLI flags
(`python3 -m bench.acceptance.speculators train`)."""

from __future__ import annotations

import shlex

# speculators 0.9.0's EAGLE-3 recipe (its defaults: muon, lr 1e-3, kl_div, 3 TTT steps,
# norm_before_fc and norm_output on), with what SGLang 0.5.17's LlamaForCausalLMEagle3 runs:
# its first layer adds the un-normed hidden state as the residual (--no-norm-before-residual)
# and attends over the whole sequence (--full-attention-indices 0); sdpa instead of
# flex attention (no torch.compile in the loop: see `train`)
TRAIN_FLAGS = [
    "--speculator-type", "eagle3",
    "--no-norm-before-residual",
    "--full-attention-indices", "0",
    "--draft-attn-impl", "sdpa",
    "--draft-vocab-size", "32000",
    "--total-seq-len", "8192",
]  # fmt: skip


def train(a) -> int:
    """speculators' own trainer, configured by its own CLI flags (TrainConfig.resolve)."""
    import torch

    if a.cpu:  # the smoke test: speculators' trainer hard-codes the accelerator
        import speculators.train.trainer as trainer
        import torch.utils.data as tud

        trainer.get_local_rank = lambda: "cpu"
        torch.accelerator.current_accelerator = lambda *x, **k: torch.device("cpu")
        torch.accelerator.synchronize = lambda *x, **k: None
        torch.cpu.empty_cache = lambda: None
        init = tud.DataLoader.__init__
        tud.DataLoader.__init__ = lambda self, *x, **k: init(self, *x, **{**k, "pin_memory": False})
    else:
        # no torch.compile of the draft's forward: packed batches change length every step
        # and each new length recompiles (dynamo's default); sdpa attention runs eagerly
        import torch._dynamo

        torch._dynamo.config.disable = True
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    argv = [
        *TRAIN_FLAGS,
        "--verifier-name-or-path", a.target,
        "--data-path", a.data,
        "--save-path", a.save,
        "--epochs", str(a.epochs),
        "--num-workers", str(a.num_workers),
        "--log-freq", str(a.log_freq),
        "--seed", "0",
        *a.extra,
    ]  # fmt: skip
    if a.max_steps:
        argv += ["--max-steps", str(a.max_steps)]
    if a.cpu:
        argv += ["--hidden-states-dtype", "float32", "--loss-implementation", "eager"]
    print("speculators train " + shlex.join(argv), flush=True)
    main(TrainConfig.resolve(argv))
    return 0
