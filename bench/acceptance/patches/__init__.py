"""hsdump's patches to SpecForge 0.2.0's trainer, each a module with an `apply()` that patches
SpecForge in the calling process (once: a second call does nothing). `python -m
bench.acceptance.specforge_cli` applies them before SpecForge's own CLI runs:

- `draft_options`: EAGLE-3's drafter options SGLang serves (`norm_before_fc`, `feed_post_norm`),
  no-ops unless the draft config asks for them;
- `cpu_eagle3_loss`: EAGLE-3's loss without SpecForge's Triton kernel (`--cpu`);
- `freeze_head`: EAGLE-3's drafter LM head frozen beside its embedding (`--freeze-head`);
- `muon`: speculators' optimizer split in SpecForge's optimizer (`--muon`).
"""
