"""The acceptance benchmark as a package: drafters trained on hsdump's exports, served by SGLang
beside the plain target, their accept length against their controls'.

- `python3 -m bench.acceptance <sub>`: every drafter kind SGLang serves (EAGLE-3, DFlash,
  DSpark) trained by SpecForge 0.2.0's own trainer (cli.py; run_all.py chains the pieces);
- `python3 -m bench.acceptance.speculators <sub>`: EAGLE-3 trained by speculators 0.9.0's own
  trainer, and the pieces both pipelines share (prepare, build-target, serve);
- `python3 -m bench.acceptance.specforge_cli [--cpu] <SpecForge CLI args>`: SpecForge's own CLI
  with hsdump's patches (patches/) applied in its process.

README.md is the usage guide. The names below are the ones the probes (bench/lr_probe.py,
bench/repetition.py, bench/online_bench.py) and the tests use; every module imports only the
standard library at its top, so importing the package is cheap (torch, SpecForge and SGLang are
imported where they are used).
"""

from .capture import WRONG_TEMPLATE, capture_args, extract_unchecked, off_by_one
from .cli import main
from .contract import served_gaps
from .drafter import (
    ALGORITHM,
    BLOCK_SIZE,
    DRAFT_LAYERS,
    DRAFTER_FLAGS,
    DSPARK_HEAD,
    EXPORT_TO,
    KINDS,
    SERVED_STEPS,
    TRAINING,
    draft_config,
    drafter_options,
    export_facts,
    write_draft_config,
)
from .pipeline import (
    ROOT,
    Pipeline,
    claim_work,
    dataset_facts,
    env_facts,
    package_env,
    python_cmd,
    run_thread,
)
from .plan import disk_plan, session_fit, trace_summary, training_plan
from .specforge import (
    checkpoints,
    eval_curve,
    last_step,
    predicted_accept_length,
    split_records,
    step_time,
    train_dtype,
    trainer_metrics,
)
from .table import (
    collate,
    divergence,
    epoch_curves,
    paired,
    read_json,
    served_name,
    step_acceptance,
)
from .target import PRESET, PRESET_PATH, mask_token_id, target_of, trainer_target

__all__ = [
    "ALGORITHM",
    "BLOCK_SIZE",
    "DRAFTER_FLAGS",
    "DRAFT_LAYERS",
    "DSPARK_HEAD",
    "EXPORT_TO",
    "KINDS",
    "PRESET",
    "PRESET_PATH",
    "Pipeline",
    "ROOT",
    "SERVED_STEPS",
    "TRAINING",
    "WRONG_TEMPLATE",
    "capture_args",
    "checkpoints",
    "claim_work",
    "collate",
    "dataset_facts",
    "disk_plan",
    "divergence",
    "draft_config",
    "drafter_options",
    "env_facts",
    "epoch_curves",
    "eval_curve",
    "export_facts",
    "extract_unchecked",
    "last_step",
    "main",
    "mask_token_id",
    "off_by_one",
    "package_env",
    "paired",
    "predicted_accept_length",
    "python_cmd",
    "read_json",
    "run_thread",
    "served_gaps",
    "served_name",
    "session_fit",
    "split_records",
    "step_acceptance",
    "step_time",
    "target_of",
    "trace_summary",
    "train_dtype",
    "trainer_metrics",
    "trainer_target",
    "training_plan",
    "write_draft_config",
]
