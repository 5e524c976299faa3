"""Every drafter kind SGLang serves, trained by SpecForge on hsdump's exports (issue 43, item 3).

`python3 -m bench.acceptance <sub>`: the pipeline's pieces and run-all (README.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .contract import contract, served_gaps, sglang_load, untrained_export
from .drafter import (
    BLOCK_SIZE,
    DRAFT_ARCH,
    KINDS,
    drafter_flags,
    drafter_options,
    write_draft_config,
)
from .plan import plan_capture, session_fit, trace_summary, training_plan
from .predict import predict
from .run_all import run_all
from .specforge import export, train
from .speedup import margins, speedup
from .table import curves, table
from .target import trainer_target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m bench.acceptance", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("draft-config", help="the drafter's config (its recipe) on an export")
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--export", required=True, help="hsdump's export (its serving ids)")
    p.add_argument("--out", required=True)
    p.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    drafter_flags(p)

    def training_flags(p, backends=("sdpa", "flex_attention")):
        p.add_argument("--epochs", type=int, default=2)
        p.add_argument("--max-steps", type=int, default=None)
        p.add_argument(
            "--save-interval",
            type=int,
            default=200,
            help="checkpoint (and evaluate) every N steps (0: every half epoch; on the H200 "
            "SpecForge's DFlash trainer made 340-380 steps in a 90 s budget, two at a time, "
            "so half an epoch of 2,000 samples is never reached within a budget)",
        )
        p.add_argument(
            "--keep-checkpoints",
            type=int,
            default=0,
            help="SpecForge's training.max_checkpoints: the newest N checkpoints are kept, the "
            "older deleted as each is written (0: SpecForge keeps every one; a 1.5B target's "
            "EAGLE-3 run of 3,000 steps saved every 100 would fill the host's disk)",
        )
        p.add_argument("--eval-samples", type=int, default=100)
        p.add_argument(
            "--batch-size",
            type=int,
            default=8,
            help="records per optimizer step: SpecForge's recipes run batch 1 on each of 8 "
            "GPUs (their learning rates are for a global batch of 8); the H200 runs of "
            "2026-12-03 trained at batch 1 (0.11 s a step, two trainers on the GPU) and "
            "reached a fifth of an epoch in their budget",
        )
        p.add_argument("--max-length", type=int, default=1024)
        p.add_argument(
            "--learning-rate",
            type=float,
            default=None,
            help="SpecForge's training.learning_rate (default: the kind's recipe, TRAINING; "
            "EAGLE-3's 1e-4 left its drafter still learning when the cosine schedule ended, "
            "five epochs of 2,018 records, the H200 run of 2026-12-04)",
        )
        p.add_argument(
            "--ttt-length",
            type=int,
            default=None,
            help="EAGLE-3: SpecForge's training.ttt_length, the draft steps unrolled in training "
            "(default: the recipe's 7; SGLang serves 3 here, speculators' trainer unrolls 3)",
        )
        p.add_argument(
            "--optimizer",
            default="adamw",
            choices=("adamw", "muon"),
            help="adamw: SpecForge 0.2.0's own (AdamW over fp32 masters, no weight decay); "
            "muon: speculators' split in SpecForge's optimizer (Muon on the 2-D matrices, "
            "AdamW on the rest; not run on a GPU yet)",
        )
        p.add_argument(
            "--head-init",
            default="random",
            choices=("random", "target", "target-frozen"),
            help="EAGLE-3's drafter LM head at the start: random (SpecForge's own start) or "
            "the target's rows for the draft vocabulary (speculators' start), a warm start "
            "through SpecForge's model.draft_checkpoint_path; target-frozen: started there and "
            "never trained, as speculators' trainer keeps it. On SmolLM2 at 1e-3 the trained "
            "target's head was no better than a random one (held-out accuracy 0.309 and 0.320 at "
            "step 300, the H200 probe of 2026-12-04); the frozen one has not run on a GPU",
        )
        p.add_argument("--num-workers", type=int, default=4)
        p.add_argument("--cpu", action="store_true", help="SpecForge's DDP (NO_SHARD) on gloo")
        p.add_argument(
            "--dtype",
            choices=("bfloat16", "float32"),
            help="SpecForge's model.torch_dtype (default: bfloat16; float32 for DFlash and "
            "DSpark with --cpu, whose bf16 matmuls are slow on a CPU without native bf16)",
        )
        p.add_argument(
            "--attention-backend",
            default=backends[-1] if "auto" in backends else "sdpa",
            choices=backends,
            help="SpecForge's training.attention_backend (its default is flex_attention, "
            "compiled; sdpa runs DFlash's block mask dense); run-all's auto (its default): "
            "the probe's faster one (--probe-steps), sdpa where no probe ran",
        )

    p = sub.add_parser(
        "trainer-target",
        help="the target folder as SpecForge's trainer reads it (with model.safetensors."
        "index.json): links to the target's files in --out; prints the folder to pass",
    )
    p.add_argument("--target", required=True, help="a model folder or a built-in name")
    p.add_argument("--out", required=True)
    p = sub.add_parser("train", help="SpecForge's trainer on an export (its recipe)")
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--draft-config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument(
        "--log-copy",
        default=None,
        help="also write SpecForge's log here as it comes, without its progress-bar lines "
        "(run-all: the results folder, which the host's poll copies back)",
    )
    p.add_argument(
        "--profile-at",
        type=int,
        default=0,
        help="SpecForge's own profiler (profiling.enabled) over 4 optimizer steps from this "
        "one; its trace goes into the run folder (0: off)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=2,
        help="a trainer that dies is resumed from its newest checkpoint this many times",
    )
    training_flags(p)
    p = sub.add_parser("export", help="SpecForge's export of a checkpoint (the served folder)")
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--ckpt", required=True, help="a -stepN folder, or the run's output_dir")
    p.add_argument("--draft-config", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser(
        "predict", help="DFlash's or DSpark's accept length as SpecForge's code predicts it"
    )
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--train", required=True, help="the training folder (its run.json)")
    p.add_argument("--drafter", required=True, help="SpecForge's export of the checkpoint")
    p.add_argument("--records", default=None, help="default: the run's held-out records")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--json", required=True)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--answer-tokens", type=int, default=0,
                   help="count only the first N tokens of each supervised run (an answer), as "
                   "serving N new tokens sees them; 0: every token")  # fmt: skip
    p = sub.add_parser(
        "disk-plan", help="what run-all holds on disk at each kind's peak, from its first capture"
    )
    p.add_argument("--capture", required=True, help="run-all's first capture (ds/default)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--no-template-control", action="store_true")
    p.add_argument("--reference-batch", type=int, default=None)
    p.add_argument("--speculators", action="store_true")
    p.add_argument("--overlap", action="store_true")
    p.add_argument("--disk-gb", type=float, default=None)
    p.add_argument("--no-controls", action="store_true", help="as run-all --no-controls")
    p = sub.add_parser(
        "check-served", help="SGLang's class for the folder's architecture loads it (CPU)"
    )
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--folder", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--ids", required=True, help="the serving ids, comma-separated")
    p = sub.add_parser(
        "contract", help="the config and weight-name contract, untrained, every kind (CPU)"
    )
    p.add_argument("--target", required=True, help="a model folder or tiny:llama")
    p.add_argument("--out", required=True)
    p.add_argument("--kinds", default=",".join(KINDS))
    p = sub.add_parser("untrained", help="an untrained drafter, exported (the smoke serve)")
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--draft-config", required=True)
    p.add_argument("--work", required=True, help="its training_state.pt goes here")
    p.add_argument("--out", required=True)
    p = sub.add_parser("margins", help="the target's margin where served greedy outputs part")
    p.add_argument("--target", required=True)
    p.add_argument("--heldout", required=True)
    p.add_argument("--plain", required=True, help="the plain row's serve JSON")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("rows", nargs="+", help="the drafter rows' serve JSONs")
    p = sub.add_parser("speedup", help="the speed table of a run-all with --serve-settings")
    p.add_argument("--results", required=True)
    p.add_argument("--target", required=True, help="the target's name (or folder)")
    p.add_argument("--json", required=True)
    p = sub.add_parser("table", help="the table from a results folder's serve runs")
    p.add_argument("--results", required=True)
    p.add_argument("--json")
    p = sub.add_parser("curves", help="the trainers' eval and per-epoch curves of a results folder")
    p.add_argument("--results", required=True)
    p.add_argument("--steps-per-epoch", type=int)
    p.add_argument("--json")
    p = sub.add_parser("fit", help="what one session holds, from a whole run's pipeline.json")
    p.add_argument("--results", required=True)
    p.add_argument("--budget-s", type=float, default=1800.0)
    p.add_argument("--before-s", type=float, default=0.0,
                   help="GPU seconds before run-all starts: the calls, the import check")  # fmt: skip
    p.add_argument("--epochs", default="1,2,5")
    p.add_argument("--margin-s", type=float, default=0.0,
                   help="GPU seconds kept free: a slower host, a failed start")  # fmt: skip
    p = sub.add_parser("plan", help="the backend and epochs run-all trains with, from a probe")
    p.add_argument("--kind", choices=KINDS, default="dflash")
    p.add_argument("--probe", required=True, help="a probe-KIND.json")
    p.add_argument("--records", type=int, required=True, help="the kind's exported records")
    p.add_argument("--train-budget-s", type=float, default=100)
    p.add_argument("--epochs-fit", action="store_true")
    p.add_argument("--side-by-side", type=int, default=2, help="trainers sharing the GPU")
    training_flags(p, backends=("sdpa", "flex_attention", "auto"))
    p = sub.add_parser("trace", help="a PyTorch profiler trace summarised by kernel")
    p.add_argument("--file", required=True)
    p = sub.add_parser(
        "run-all", help="the whole pipeline on one GPU (or --device cpu: the toy chain)"
    )
    p.add_argument("--work", default="/tmp/acck")
    p.add_argument("--data", default=".acc/data")
    p.add_argument("--results", default=None, help="results and logs (default WORK/results)")
    p.add_argument("--target", default=None, help="a model folder (default: smollm2_135m)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument(
        "--samples",
        type=int,
        default=4000,
        help="dataset.max_samples (issue 43 asks at least the 4K of the first benchmark; the "
        "second GPU run used 2000)",
    )
    p.add_argument("--max-new-tokens", type=int, default=512, help="regeneration")
    p.add_argument("--regen-kv-tokens", type=int, default=2_500_000)
    p.add_argument("--capture-kv-tokens", type=int, default=300_000)
    p.add_argument(
        "--train-budget-s", type=float, default=100, help="per kind, its runs side by side"
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="capture the controls and run SpecForge's own capture side by side (each engine's "
        "KV pool is capped), then alone whatever failed beside the others",
    )
    p.add_argument(
        "--train-end-s",
        type=float,
        default=None,
        help="stop the trainings at this many seconds after run-all started, sooner than "
        "--train-budget-s would, so that a slow capture still leaves the exports and the "
        "serving their time before the host's deadline",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="run-all ends within this many seconds of its start (run-0523.sh's acck step passes "
        "what its deadline leaves): the trainings stop --after-train-s before it at the latest",
    )
    p.add_argument(
        "--after-train-s",
        type=float,
        default=300,
        help="kept for what follows the trainings under --deadline-s: SpecForge's exports, "
        "predict, the engines (a retry included); 233-245 s in the runs of 2026-12-04/05",
    )
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument("--serve-new-tokens", type=int, default=256)
    p.add_argument("--serve-limit", type=int, default=None, help="held-out prompts served")
    p.add_argument("--batch1", type=int, default=8)
    p.add_argument(
        "--engines-at-once",
        type=int,
        default=3,
        help="serving engines started together, then timed one at a time (SmolLM2 with a "
        "300,000-token KV pool needs about 8 GB of an H200 each, CUDA graphs beside)",
    )
    p.add_argument(
        "--serve-turns",
        type=int,
        default=0,
        metavar="K",
        help="time batch 1 in turns: the engines started together (--engines-at-once) take "
        "the GPU K prompts at a time, plain and each drafter over the same minutes, before "
        "their batched runs (0: each engine's batch 1 timed alone, one after another)",
    )
    p.add_argument(
        "--serve-stagger-s",
        type=float,
        default=10.0,
        help="seconds between the starts of engines started together, so that each sizes its "
        "KV pool while no other allocates one (0: all at once; an engine that still loses the "
        "race is served again alone)",
    )
    p.add_argument(
        "--mem-fraction",
        type=float,
        default=None,
        help="each engine's mem_fraction_static (default 0.5: the KV pool is capped at 300,000 "
        "tokens, so this sets only SGLang's free-memory check at its start; the H200 "
        "runs of 2026-12-03 served 3 at 0.3)",
    )
    p.add_argument(
        "--eager-drafters",
        action="store_true",
        help="no CUDA graphs for the drafters' engines (default: graphs, eager if they fail)",
    )
    p.add_argument("--keep-exports", action="store_true")
    p.add_argument(
        "--no-controls",
        action="store_true",
        help="the drafter alone: no layer-off or template control (with --kinds "
        "eagle3, the capture holds EAGLE-3's layers and the post-norm state only)",
    )
    p.add_argument(
        "--model-preset",
        default=None,
        help="extract.py's model=NAME (conf/model/NAME.yaml) for --target's path",
    )
    p.add_argument(
        "--serve-settings",
        default=None,
        help="EAGLE-3 served at each STEPS,TOPK,TOKENS of a ;-list, one engine each "
        "(then `margins` and `speedup`); STEPS,TOPK,TOKENS,gc: that engine freezes Python's "
        "collector after its warm-up (serve --freeze-gc), a row of its own",
    )
    p.add_argument(
        "--batch-sizes",
        default=None,
        help="each served row also sends the prompts B at a time (e.g. 8,32)",
    )
    p.add_argument("--serve-kv-tokens", type=int, default=300000)
    p.add_argument(
        "--check-samples",
        type=int,
        default=0,
        help="`hsdump check` this many samples of the first capture (0: none)",
    )
    p.add_argument(
        "--no-smoke-serve",
        action="store_true",
        help="skip the smoke serve: an untrained drafter of each kind served on 8 prompts "
        "beside the trainers (on the GPU), so that a kind SGLang cannot serve on the host is "
        "known while the drafters train",
    )
    drafter_flags(p)
    p.add_argument(
        "--no-cap-accept",
        action="store_true",
        help="DSpark: skip serving the drafter again in SGLang's cap-accept mode (its "
        "confidence head capping each request's accepted drafts)",
    )
    p.add_argument(
        "--control-own-layers",
        action="store_true",
        help="serve each layer-off control a second time on the layers it was trained on "
        "(`KIND-layer_off_own`): beside its row on the drafter's layers, what reading the "
        "layers one off costs it when served; the table pairs the two",
    )
    p.add_argument(
        "--no-template-control",
        action="store_true",
        help="skip EAGLE-3's wrong-template control (its capture, training and serving)",
    )
    p.add_argument(
        "--reference-python",
        default=None,
        help="SpecForge's own stack's interpreter (tools/reference/make-venv-sf514.sh, or "
        "tools/offline_host/python514.sh): EAGLE-3 also trains and serves a drafter on "
        "SpecForge's own capture of the same token ids (bench/reference_capture.py)",
    )
    p.add_argument("--reference-batch", type=int, default=32, help="SpecForge's capture batch")
    p.add_argument(
        "--speculators",
        action="store_true",
        help="EAGLE-3 also gets a drafter trained by speculators 0.9.0's own trainer and recipe "
        "(python3 -m bench.acceptance.speculators train) on hsdump's --to speculators export "
        "of the same capture, converted to SGLang's layout (its convert) and served the same "
        "way: the eagle3-speculators line (speculators and its deps on the Python path)",
    )
    p.add_argument(
        "--disk-gb",
        type=float,
        default=None,
        help="the disk the run may fill (default: the work folder's free space, measured after "
        "the first capture, plus that capture's); a plan that does not fit stops there",
    )
    p.add_argument("--device", default="cuda", help="cpu: the toy chain here, no serving")
    p.add_argument(
        "--probe-steps",
        type=int,
        default=None,
        help="before a kind trains: SpecForge's trainer alone on the drafter's records for N "
        "steps with each attention backend (sdpa, flex_attention), its own per-step timing "
        "(perf/...) and profiler trace summarised (probe-KIND.json); --attention-backend auto "
        "takes the faster (default 40 on cuda, 0 on cpu: no probe)",
    )
    p.add_argument(
        "--epochs-fit",
        action="store_true",
        help="train for as many epochs as the probe's step time says fit in --train-budget-s "
        "with drafter and control side by side (at least --epochs)",
    )
    p.add_argument("--probe-timeout-s", type=float, default=180, help="each probe run's limit")
    training_flags(p, backends=("sdpa", "flex_attention", "auto"))
    a = ap.parse_args(argv)
    if a.cmd == "draft-config":
        ids = write_draft_config(a.kind, a.target, a.export, a.out, a.block_size,
                                 **drafter_options(a))  # fmt: skip
        print(json.dumps(dict(out=a.out, ids=ids, arch=DRAFT_ARCH[a.kind])))
        return 0
    if a.cmd == "trainer-target":
        from hsdump.tiny import resolve_model_path

        target = a.target if Path(a.target).is_dir() else resolve_model_path(a.target)
        print(trainer_target(target, Path(a.out)))
        return 0
    if a.cmd == "train":
        return train(a)
    if a.cmd == "export":
        return export(a)
    if a.cmd == "predict":
        return predict(a)
    if a.cmd == "disk-plan":  # what run-all would check after that capture; exit 2: no fit
        kinds = [k for k in KINDS if k in a.kinds.split(",")]
        try:
            facts = plan_capture(Path(a.capture), kinds,
                                 "eagle3" in kinds and not a.no_template_control
                                 and not a.no_controls,
                                 a.reference_batch, a.speculators, a.disk_gb, Path(a.capture),
                                 a.overlap, controls=not a.no_controls)  # fmt: skip
        except SystemExit as e:
            print(e, file=sys.stderr)
            return 2
        print(json.dumps(facts))
        return 0
    if a.cmd == "check-served":
        ids = [int(x) for x in a.ids.split(",")]
        r = sglang_load(a.target, [a.folder])[a.folder]
        gaps = served_gaps(r, a.kind, ids)
        print(json.dumps(dict(gaps=gaps, **{k: v for k, v in r.items() if k != "params"})))
        return 1 if gaps else 0
    if a.cmd == "margins":
        return margins(a)
    if a.cmd == "speedup":
        return speedup(a)
    if a.cmd == "table":
        return table(a)
    if a.cmd == "curves":
        return curves(a)
    if a.cmd == "fit":
        pipe = json.loads((Path(a.results) / "pipeline.json").read_text())
        epochs = [int(x) for x in a.epochs.split(",")]
        print(json.dumps(session_fit(pipe, a.budget_s, a.before_s, epochs, a.margin_s), indent=1))
        return 0
    if a.cmd == "plan":
        pr = json.loads(Path(a.probe).read_text())
        print(json.dumps(training_plan(a, a.kind, pr, a.records, a.side_by_side)))
        return 0
    if a.cmd == "trace":
        print(json.dumps(trace_summary(Path(a.file))))
        return 0
    if a.cmd == "contract":
        return contract(a)
    if a.cmd == "untrained":  # the folder the smoke serve loads (run-all)
        untrained_export(a.kind, a.draft_config, a.work, a.out)
        return 0
    return run_all(a)
