"""A real model, end to end (issue 32): a drafter trained on hsdump's data, served by SGLang.

`python3 -m bench.acceptance.speculators <sub>` (README.md)."""

from __future__ import annotations

import argparse
import json
import sys

from ..capture import extract_unchecked
from ..prepare import prepare
from ..serve import serve
from ..target import PRESET_PATH, build_target, target_folder
from .convert import DEFAULT_LAYERS, convert
from .run_all import run_all
from .table import table
from .trainer import train


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m bench.acceptance.speculators", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--heldout", type=int, default=256)
    p.add_argument("--max-chars", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=".acc/data")
    p = sub.add_parser("build-target")
    p.add_argument("--preset", action="store_true", help=f"hsdump's {PRESET_PATH}")
    p.add_argument("--gguf")
    p.add_argument("--out")
    sub.add_parser("extract-unchecked", add_help=False)
    p = sub.add_parser("train")
    p.add_argument("--data", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--save", required=True)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--log-freq", type=int, default=20)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("extra", nargs="*", help="more speculators flags, after -- (they win)")
    p = sub.add_parser("convert")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--aux-layers", default=",".join(map(str, DEFAULT_LAYERS)))
    p = sub.add_parser("serve")
    p.add_argument("--target", required=True)
    p.add_argument("--heldout", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--drafter")
    p.add_argument("--algorithm", default="EAGLE3", choices=("EAGLE3", "DFLASH", "DSPARK"))
    p.add_argument("--json", required=True)
    p.add_argument("--limit", type=int)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch1", type=int, default=8)
    p.add_argument("--mem-fraction", type=float, default=0.9)
    p.add_argument("--max-total-tokens", type=int, default=300000)
    p.add_argument("--cuda-graph-max-bs", type=int, default=None, help="default: SGLang's")
    p.add_argument("--device", default="cuda")
    p.add_argument("--ready")
    p.add_argument("--go")
    p.add_argument("--release")
    p.add_argument(
        "--turns",
        help="a folder: time batch 1 in turns with the engines started beside this one, "
        "before the batched runs (bench/acceptance/turns.py; run-all --serve-turns hands them)",
    )
    p.add_argument(
        "--turn-prompts",
        type=int,
        default=16,
        help="batch-1 prompts a group (a turn, with --turns); CPU steal and GPU clock are read "
        "between groups",
    )
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument(
        "--freeze-gc",
        action="store_true",
        help="after the warm-up, SGLang's Engine.freeze_gc(): the scheduler's objects so far "
        "leave Python's collector (a suspect for a speculative round that grows dearer)",
    )
    p.add_argument("--spec", help="EAGLE-3's STEPS,TOPK,DRAFT_TOKENS (default 3,1,4)")
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",") if x],
                   default=[], help="also serve the prompts B at a time, for each B")  # fmt: skip
    p.add_argument("--attention-backend", default=None, help="default triton")
    p.add_argument(
        "--ragged-verify-mode",
        choices=("static", "cap-accept", "compact"),
        help="SGLANG_RAGGED_VERIFY_MODE for this engine (DSpark: static, SGLang's default, "
        "verifies every draft; cap-accept builds the confidence head, which caps each "
        "request's accepted drafts; the uncapped count is kept as block_accept_length)",
    )
    p.add_argument(
        "--margins",
        action="store_true",
        help="the plain target only: after the timings, the prompts again with the top-2 "
        "logprobs of every output token (plain_margins: how near a tie each greedy choice "
        "was; `divergence` reads them)",
    )
    p = sub.add_parser("table")
    p.add_argument("--results", required=True)
    p.add_argument("--json")
    p = sub.add_parser("run-all")
    p.add_argument("--work", default="/tmp/acc")
    p.add_argument("--data", default=".acc/data")
    p.add_argument("--gguf", default="/tmp/stage/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--window", type=int, default=4096)
    p.add_argument("--regen-kv-tokens", type=int, default=2_500_000)
    p.add_argument("--capture-kv-tokens", type=int, default=300_000)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--train-budget-s", type=float, default=300, help="from the trainings' start")
    p.add_argument("--serve-new-tokens", type=int, default=256)
    p.add_argument("--batch1", type=int, default=8)
    p.add_argument("--samples", type=int, default=None, help="dataset.max_samples")
    p.add_argument("--serve-limit", type=int, default=None, help="held-out prompts served")
    p.add_argument("--device", default="cuda", help="cpu: a rehearsal of the whole run here")
    p.add_argument("--skip-train", action="store_true", help="serve the converted drafters")
    p.add_argument(
        "--serve-graphs",
        action="store_true",
        help="CUDA graphs in the drafters' engines too (SGLang 0.5.17's EAGLE-3 draft graphs "
        "import deep_gemm: install sgl-deep-gemm beside the bundle); the plain target runs "
        "both ways either way",
    )
    p.add_argument("--train-extra", default="", help="more speculators flags, e.g. for cpu")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["extract-unchecked"]:
        return extract_unchecked(argv[1:])
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a)
    if a.cmd == "build-target":
        print(target_folder() if a.preset else build_target(a.gguf, a.out))
        return 0
    if a.cmd == "train":
        return train(a)
    if a.cmd == "convert":
        layers = [int(x) for x in a.aux_layers.split(",")]
        print(json.dumps(convert(a.ckpt, a.out, layers)))
        return 0
    if a.cmd == "serve":
        return serve(a)
    if a.cmd == "table":
        return table(a)
    if a.cmd == "run-all":
        return run_all(a)
    return 2
