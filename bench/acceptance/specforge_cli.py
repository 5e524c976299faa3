"""SpecForge 0.2.0's own CLI with hsdump's patches applied in its process:

    python3 -m bench.acceptance.specforge_cli [--cpu] [--freeze-head] [--muon] <SpecForge CLI args>

e.g. `python3 -m bench.acceptance.specforge_cli --cpu train --config run.yaml` is SpecForge's
`python -m specforge.cli train --config run.yaml` with:

- always, EAGLE-3's drafter options SGLang serves (patches/draft_options.py: no-ops unless the
  draft config asks for `norm_before_fc` or `feed_post_norm`);
- `--cpu`: EAGLE-3's loss without SpecForge's Triton kernel (patches/cpu_eagle3_loss.py), so that
  EAGLE-3 trains on a CPU (DFlash and DSpark need no patch there);
- `--freeze-head`: EAGLE-3's drafter LM head frozen (patches/freeze_head.py);
- `--muon`: speculators' Muon/AdamW split in SpecForge's optimizer (patches/muon.py).

The flags come before SpecForge's own arguments; everything from the first other argument on is
SpecForge's. SpecForge must be importable (its wheel on PYTHONPATH: README.md).
"""

from __future__ import annotations

import runpy
import sys

FLAGS = ("--cpu", "--freeze-head", "--muon")


def split_args(argv: list) -> tuple:
    """(this runner's flags, SpecForge's arguments): the leading FLAGS, then the rest."""
    ours = []
    for i, x in enumerate(argv):
        if x not in FLAGS:
            return ours, list(argv[i:])
        ours.append(x)
    return ours, []


def apply(cpu: bool = False, freeze_head: bool = False, muon: bool = False) -> None:
    """hsdump's patches in this process, in the order the trainer's runs applied them."""
    from .patches import draft_options

    draft_options.apply()
    if cpu:
        from .patches import cpu_eagle3_loss

        cpu_eagle3_loss.apply()
    if freeze_head:
        from .patches import freeze_head as fh

        fh.apply()
    if muon:
        from .patches import muon as mu

        mu.apply()


def main(argv=None) -> None:
    ours, rest = split_args(sys.argv[1:] if argv is None else argv)
    if not rest or rest[0] in ("-h", "--help"):  # SpecForge's own: `train --help`
        print(__doc__)
        raise SystemExit(0 if rest else 2)
    apply("--cpu" in ours, "--freeze-head" in ours, "--muon" in ours)
    sys.argv = ["specforge", *rest]
    runpy.run_module("specforge.cli", run_name="__main__")


if __name__ == "__main__":
    main()
