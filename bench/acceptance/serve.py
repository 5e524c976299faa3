"""SGLang serving one row: the plain target, or the target with a drafter (EAGLE-3, DFlash,
DSpark), greedy on the held-out prompts, batched and at batch 1
(`python3 -m bench.acceptance.speculators serve`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .turns import (
    Turns,
    cpu_times,
    gpu_clock,
    proc_cpu,
    proc_cpu_share,
    steal_by_cpu,
    steal_share,
    stolen_cpus,
)

SPEC = dict(
    speculative_algorithm="EAGLE3",
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
)


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


def host_facts() -> dict:
    """What the host's CPU is and how busy it was just before the batch-1 timing: the rounds
    of a speculative engine at batch 1 are partly CPU work, so two hosts with the same GPU
    can give different round times."""
    model = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return dict(cpu_model=model, cpus=os.cpu_count(),
                loadavg_before_batch1=[round(x, 2) for x in os.getloadavg()])  # fmt: skip


def _gen(eng, ids, sp, **kw):
    t = time.perf_counter()
    outs = eng.generate(input_ids=ids, sampling_params=sp, **kw)
    return outs, time.perf_counter() - t


def batch1(eng, prompts, sp, group: int = 16, turns=None):
    """The prompts one by one (tokens/s at batch 1), in groups of `group`: with `turns`
    (turns.Turns) each group waits for its turn and says when it is done. Per prompt:
    completion tokens, verify steps, wall seconds; per group: its turn, first prompt, wall
    seconds, the host's CPU steal over it (and the CPUs that lost time to it), how busy each of
    the engine's processes was (CPU seconds over wall seconds, and the CPU it ran on), and the
    GPU's clock before and after (read outside the timed calls). Returns (the batch1 dict, the
    outputs)."""
    outs, walls, groups = [], [], []
    starts = list(range(0, len(prompts), max(1, group)))
    for j, i0 in enumerate(starts):
        if turns:
            turns.wait(j)
        gpu0, cpu0, at = gpu_clock(), cpu_times(), time.time()
        procs0, each0 = proc_cpu(), steal_by_cpu()
        w_group = 0.0
        for p in prompts[i0 : i0 + group]:
            (o,), w = _gen(eng, [p], sp)
            outs.append(o)
            walls.append(w)
            w_group += w
        groups.append(dict(turn=j, first=i0, prompts=len(prompts[i0 : i0 + group]),
                           wall_s=round(w_group, 4), at=round(at, 3),
                           steal_share=steal_share(cpu0, cpu_times()),
                           stolen_cpus=stolen_cpus(each0, steal_by_cpu()),
                           busy=proc_cpu_share(procs0, proc_cpu(), time.time() - at),
                           gpu_before=gpu0, gpu_after=gpu_clock()))  # fmt: skip
        if turns:
            turns.done(j, last=j == len(starts) - 1)
    tok = sum(int(o["meta_info"]["completion_tokens"]) for o in outs)
    ver = sum(int(o["meta_info"].get("spec_verify_ct") or 0) for o in outs)
    wall = sum(walls)
    res = dict(
        prompts=len(prompts),
        completion_tokens=tok,
        wall_s=round(wall, 3),
        tokens_per_s=round(tok / wall, 1) if wall else None,
        accept_length=round(tok / ver, 4) if ver else None,
        # per prompt: completion tokens, verify steps, wall seconds
        per_prompt=[
            [
                int(o["meta_info"]["completion_tokens"]),
                int(o["meta_info"].get("spec_verify_ct") or 0),
                round(w, 5),
            ]
            for o, w in zip(outs, walls)
        ],  # fmt: skip
        groups=groups,
        in_turns=bool(turns),
        turns_session=turns.session if turns else None,
    )
    return res, outs


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


def in_groups(eng, prompts, sp, b: int) -> dict:
    """The prompts sent b at a time (each group waits for the last): tokens/s and accept
    length at batch b (the last group may be smaller)."""
    tok = ver = 0
    wall = 0.0
    for i in range(0, len(prompts), b):
        outs, w = _gen(eng, prompts[i : i + b], sp)
        tok += sum(int(o["meta_info"]["completion_tokens"]) for o in outs)
        ver += sum(int(o["meta_info"].get("spec_verify_ct") or 0) for o in outs)
        wall += w
    return dict(prompts=len(prompts), batch=b, completion_tokens=tok, wall_s=round(wall, 3),
                tokens_per_s=round(tok / wall, 1) if wall else None,
                spec_verify_ct=ver, accept_length=round(tok / ver, 4) if ver else None)  # fmt: skip


def serve(a) -> int:
    """One engine (the plain target, or the target with --drafter), greedy on the held-out
    prompts: all at once (accept length, outputs), then --batch1 of them one by one (tokens/s
    at batch 1). With --ready/--go files the engine starts, says so, and waits its turn, so
    that several engines start together and are timed one at a time. With --turns the batch-1
    timing comes first, a group of --turn-prompts prompts at each turn the coordinator hands
    (turns.py), so that the engines started together are timed over the same minutes."""
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
        # the engines started together wait idle while one is timed: SGLang's idle scheduler
        # otherwise polls without a pause and holds a CPU thread at 100 % (its IdleSleeper),
        # beside the timed engine's own CPU work (a speculative round's most of all)
        sleep_on_idle=True,
    )
    if getattr(a, "attention_backend", None):
        kw["attention_backend"] = a.attention_backend
    if getattr(a, "cuda_graph_max_bs", None):
        kw["cuda_graph_max_bs"] = a.cuda_graph_max_bs
    if a.drafter:  # EAGLE3 at 3 steps, top-k 1 unless given; DFLASH/DSPARK at their own block
        spec = dict(SPEC) if a.algorithm == "EAGLE3" else {"speculative_algorithm": a.algorithm}
        if a.algorithm == "EAGLE3" and getattr(a, "spec", None):
            steps, topk, tokens = (int(x) for x in a.spec.split(","))
            spec.update(speculative_num_steps=steps, speculative_eagle_topk=topk,
                        speculative_num_draft_tokens=tokens)  # fmt: skip
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
        # and at batch 1, which the timings use: on the H100 of 2026-12-07 the first 192-token
        # prompts ran slower than the next (plain 4-7 %, the drafter at 3, 1, 4 about 30 %)
        for p in prompts[-2:]:
            _gen(eng, [p], sp)
        if getattr(a, "freeze_gc", False):  # the warm-up's objects out of the collector's way
            eng.freeze_gc()
            res["freeze_gc"] = True
        if a.ready:
            Path(a.ready).write_text("ready\n")
        turns = Turns(a.turns, a.name) if getattr(a, "turns", None) else None

        def timed_batch1():
            res["host"] = host_facts()
            n1 = min(a.batch1, len(prompts))
            group = getattr(a, "turn_prompts", None) or 16
            res["batch1"], outs = batch1(eng, prompts[:n1], sp, group, turns)
            res["host"]["loadavg_after_batch1"] = [round(x, 2) for x in os.getloadavg()]
            return outs

        if turns:  # batch 1 first, in turns with the engines started beside this one
            outs1 = timed_batch1()
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
        if not turns:  # timed alone, after the batched run
            outs1 = timed_batch1()
        for b in getattr(a, "batch_sizes", None) or []:  # the prompts in groups of b at once
            res[f"batch{b}"] = in_groups(eng, prompts, sp, b)
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
