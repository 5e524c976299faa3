"""Does the drafter make the target faster? The speed table of a run-all with
`--serve-settings` (issue 74): each served EAGLE-3 setting against plain decoding of the same
prompts on the same host, the cost of one speculative round against one plain step (so which
accept length breaks even), and where the drafter's greedy outputs leave plain's, the target's
own margin there.

    python3 -m bench.acceptance margins --target T --heldout H --plain serve-plain.json \\
        --out margins.json serve-eagle3-default-s3-1-4.json ...
    python3 -m bench.acceptance speedup --results R --json R/speedup.json

Times are SGLang's own requests timed from the client: at batch 1 a row's wall time over its
prompts. One plain step is plain's wall time over its tokens; one speculative round is the
drafter's wall time over its verify steps (SGLang's `spec_verify_ct`: one round, drafting and
verifying, per verify step). The accept length that breaks even is round / step: the tokens a
round must yield to cost what plain pays for them; 1.3x and 1.5x need 1.3 and 1.5 times it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .table import read_json

# the targets' names as the results state them
TARGETS = {
    "qwen2.5-coder:1.5b-instruct": "Qwen2.5-Coder-1.5B-Instruct (1.5B parameters; "
    "hsdump's qwen2.5-coder:1.5b-instruct, bf16 from its Q4_K/Q6_K GGUF)"
}
SETTING = re.compile(
    r"serve-(?P<name>.+-s(?P<steps>\d+)-(?P<topk>\d+)-(?P<tokens>\d+)(?P<gc>-gc)?)\.json(\.gz)?$"
)


def load(path) -> dict:
    """A serve JSON, as written or gzipped (the recorded runs keep theirs gzipped)."""
    p = Path(path)
    if not p.exists() and Path(f"{p}.gz").exists():
        p = Path(f"{p}.gz")
    return read_json(p)


def first_difference(a: list, b: list):
    """The first position where two greedy outputs differ (None where one is the other's
    prefix or they are equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def agreement(plain: dict, row: dict, key: str = "outputs_batch1") -> dict:
    """How many of the row's greedy outputs equal plain's (same prompts, same key), and the
    first differing position of each that does not."""
    p, r = plain.get(key) or {}, row.get(key) or {}
    ids = [i for i in r if i in p]
    diff = {i: first_difference(p[i], r[i]) for i in ids if p[i] != r[i]}
    return dict(prompts=len(ids), equal=len(ids) - len(diff), first_difference=diff)


def margins(a) -> int:
    """At each first difference between plain's batch-1 greedy output and each row's, the
    target's top-1 minus top-2 log-probability (= logit margin) after the prompt and the
    common prefix, from one SGLang engine (no CUDA graphs; its numerics are the served
    model's), and whether plain's token there was the top-1."""
    if a.device == "cpu":  # the rehearsal here: SGLang's CPU engine
        from hsdump.capture.patch import prepare_process

        prepare_process("cpu")
    from sglang.srt.entrypoints.engine import Engine

    from .serve import heldout_ids

    plain = load(a.plain)
    sids, prompts = heldout_ids(a.target, a.heldout)
    prompt_of = dict(zip(map(str, sids), prompts))
    todo, keys = [], []
    for f in a.rows:
        row = load(f)
        ag = agreement(plain, row)
        for sid, pos in ag["first_difference"].items():
            if pos is None:
                continue
            p_out = plain["outputs_batch1"][sid]
            todo.append(prompt_of[sid] + p_out[:pos])
            keys.append((row["name"], sid, pos, p_out[pos], row["outputs_batch1"][sid][pos]))
    kw = dict(model_path=a.target, skip_tokenizer_init=True, attention_backend="triton",
              sampling_backend="pytorch", disable_radix_cache=True, disable_cuda_graph=True,
              mem_fraction_static=0.5, random_seed=0, log_level="warning")  # fmt: skip
    if a.device == "cpu":
        kw.update(device="cpu", attention_backend="torch_native")
    eng = Engine(**kw)
    try:
        outs = eng.generate(input_ids=todo, return_logprob=True, top_logprobs_num=2,
                            sampling_params={"temperature": 0.0, "max_new_tokens": 1}) if todo else []  # fmt: skip
    finally:
        eng.shutdown()
    got = {}
    for (name, sid, pos, p_tok, r_tok), o in zip(keys, outs):
        top = sorted(o["meta_info"]["output_top_logprobs"][0], key=lambda x: -x[0])
        got.setdefault(name, {})[sid] = dict(
            position=pos, plain_token=p_tok, drafter_token=r_tok,
            margin=round(float(top[0][0]) - float(top[1][0]), 5),
            top1=int(top[0][1]), top2=int(top[1][1]),
            plain_is_top1=int(top[0][1]) == p_tok, drafter_is_top2=int(top[1][1]) == r_tok)  # fmt: skip
    Path(a.out).write_text(json.dumps(dict(rows=got), indent=1) + "\n")
    return 0


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def spread(per_prompt, col: int):
    """Milliseconds per unit (column `col` of a batch-1 run's per-prompt rows: 0 completion
    tokens, a plain step each; 1 verify steps, a round each) over the prompts: median, p10, p90
    and max, so that a slow stretch shows apart from a uniformly slow run. None (and no key)
    for rows written before each prompt's wall time was kept (2026-12-07)."""
    ms = [r[2] / r[col] * 1e3 for r in per_prompt or [] if len(r) > 2 and r[col]]
    if not ms:
        return None
    return dict(median=round(_pct(ms, 0.5), 3), p10=round(_pct(ms, 0.1), 3),
                p90=round(_pct(ms, 0.9), 3), max=round(max(ms), 3))  # fmt: skip


def over_run(per_prompt, col: int, parts: int = 4):
    """The same milliseconds per unit as `spread`, over the run's course: the prompts that ran
    to the longest completion (so that the fixed cost of a request weighs alike on each) in
    `parts` stretches of the batch-1 run, in the order they were served, and the median of
    each. A host whose speed drifts while one engine is timed shows here: on the H100 of
    2026-12-07 a round at 3, 1, 4 went from 3.4 to 5.5 ms over one run while plain's step
    stayed at 2.1 ms. None (and no key) for rows without each prompt's wall time."""
    rows = [r for r in per_prompt or [] if len(r) > 2 and r[col]]
    if not rows:
        return None
    longest = max(r[0] for r in rows)
    idx = [i for i, r in enumerate(rows) if r[0] == longest]
    n = len(rows)
    out = []
    for k in range(parts):
        ms = [rows[i][2] / rows[i][col] * 1e3 for i in idx if k * n <= i * parts < (k + 1) * n]
        out.append(dict(prompts=len(ms), median=round(_pct(ms, 0.5), 3) if ms else None))
    return dict(completion_tokens=longest, stretches=out)


def group_speeds(b1: dict) -> dict:
    """A batch-1 run's tokens/s by group of prompts (serve.py's `groups`): {turn: tokens/s}."""
    pp = b1.get("per_prompt") or []
    out = {}
    for g in b1.get("groups") or []:
        tok = sum(r[0] for r in pp[g["first"] : g["first"] + g["prompts"]])
        if g["wall_s"]:
            out[g["turn"]] = tok / g["wall_s"]
    return out


def by_turn(row_b1: dict, plain_b1: dict):
    """Where plain and the row were timed in turns (run-all --serve-turns): each turn's speed
    against plain's over the same prompts in the same round of turns, a paired figure that a
    drifting host moves alike on both sides; None otherwise, or where the two took their turns
    apart (their `turns_session` differs)."""
    if not (row_b1.get("in_turns") and plain_b1.get("in_turns")):
        return None
    if row_b1.get("turns_session") != plain_b1.get("turns_session"):  # not timed together
        return None  # (an engine served again alone after a KV-pool race)
    r, p = group_speeds(row_b1), group_speeds(plain_b1)
    x = sorted(r[j] / p[j] for j in r if j in p and p[j])
    if not x:
        return None
    return dict(turns=len(x), median=round(_pct(x, 0.5), 3), min=round(x[0], 3),
                max=round(x[-1], 3))  # fmt: skip


def host_over_groups(b1: dict):
    """The host over a batch-1 run's groups: the largest share of CPU time stolen by the
    hypervisor, the GPU's SM clock, lowest and highest, and how busy the engine's busiest
    process was (CPU seconds over wall seconds; 1 is one thread busy all the group, as a
    scheduler whose decode waits on the CPU),
    lowest and highest; None for rows without groups."""
    gs = b1.get("groups") or []
    if not gs:
        return None
    steal = [g["steal_share"] for g in gs if g.get("steal_share") is not None]
    mhz = [x["sm_mhz"] for g in gs for x in (g.get("gpu_before"), g.get("gpu_after")) if x]
    busy = [g["busy"][0][1] for g in gs if g.get("busy")]
    return dict(groups=len(gs), steal_share_max=max(steal) if steal else None,
                sm_mhz_min=min(mhz) if mhz else None, sm_mhz_max=max(mhz) if mhz else None,
                busiest_min=min(busy) if busy else None,
                busiest_max=max(busy) if busy else None)  # fmt: skip


def speed_rows(res: Path) -> dict:
    """The speed table from a results folder: plain's serve JSON and each setting's."""
    plain = load(res / "serve-plain.json")
    mj = res / "margins.json"
    marg = json.loads(mj.read_text())["rows"] if mj.exists() else {}
    step_s = plain["batch1"]["wall_s"] / plain["batch1"]["completion_tokens"]
    rows, costs = [], []
    for f in sorted(res.glob("serve-*.json*")):
        m = SETTING.search(f.name)
        if not m:
            continue
        row = load(f)
        steps, topk, tokens = (int(m[k]) for k in ("steps", "topk", "tokens"))
        spec = dict(steps=steps, topk=topk, draft_tokens=tokens)
        if m["gc"]:  # served with --freeze-gc (run-all's STEPS,TOPK,TOKENS,gc)
            spec["freeze_gc"] = bool(row.get("freeze_gc"))
        b1 = row["batch1"]
        ver = sum(p[1] for p in b1.get("per_prompt") or []) or None
        round_s = b1["wall_s"] / ver if ver else None
        be = round_s / step_s if round_s else None
        costs.append(dict(variant=m["name"], **spec, plain_step_ms=round(step_s * 1e3, 3),
                          round_ms=round(round_s * 1e3, 3) if round_s else None,
                          break_even_accept_length=round(be, 3) if be else None,
                          accept_length_for_1_3x=round(1.3 * be, 3) if be else None,
                          accept_length_for_1_5x=round(1.5 * be, 3) if be else None))  # fmt: skip
        by_prompt = spread(b1.get("per_prompt"), 1)
        if by_prompt:
            costs[-1]["round_ms_by_prompt"] = by_prompt
            costs[-1]["round_ms_over_run"] = over_run(b1.get("per_prompt"), 1)
        turned = by_turn(b1, plain["batch1"])
        if turned:
            costs[-1]["speed_vs_plain_by_turn"] = turned
        host = host_over_groups(b1)
        if host:
            costs[-1]["host_over_groups"] = host
        for key in ["batch1"] + sorted((k for k in row if re.fullmatch(r"batch\d+", k) and k != "batch1"),
                                       key=lambda k: int(k[5:])):  # fmt: skip
            r, p = row.get(key), plain.get(key)
            if not r or not p:
                continue
            rows.append(dict(variant=m["name"], batch=int(key[5:]), prompts=r["prompts"],
                             tokens_per_s=r["tokens_per_s"],
                             plain_tokens_per_s=p["tokens_per_s"],
                             speed_vs_plain=round(r["tokens_per_s"] / p["tokens_per_s"], 3),
                             accept_length=r["accept_length"], **spec))  # fmt: skip
        ag = agreement(plain, row)
        ms = [x["margin"] for x in (marg.get(row["name"]) or {}).values()]
        costs[-1]["greedy"] = dict(
            prompts=ag["prompts"], equal=ag["equal"],
            margins_at_first_difference=dict(
                n=len(ms), median=_pct(ms, 0.5), p90=_pct(ms, 0.9), max=max(ms) if ms else None,
                under_0_1=sum(1 for x in ms if x < 0.1), under_0_5=sum(1 for x in ms if x < 0.5)))  # fmt: skip
    base = dict(batch1_tokens_per_s=plain["batch1"]["tokens_per_s"], step_ms=round(step_s * 1e3, 3))
    by_prompt = spread(plain["batch1"].get("per_prompt"), 0)
    if by_prompt:  # and the host's CPU, kept with it
        base.update(step_ms_by_prompt=by_prompt,
                    step_ms_over_run=over_run(plain["batch1"].get("per_prompt"), 0),
                    in_turns=bool(plain["batch1"].get("in_turns")),
                    host=plain.get("host"))  # fmt: skip
        host = host_over_groups(plain["batch1"])
        if host:
            base["host_over_groups"] = host
    return dict(plain=dict(base, engine=plain.get("engine")),
                rows=rows, costs=costs)  # fmt: skip


def speedup(a) -> int:
    """The results JSON: the target, the GPU, SGLang's version, `rows` (one per served row and
    batch), `costs` (per setting: round and step times, the break-even accept length, greedy
    agreement) and `break_even_accept_length` of the fastest setting at batch 1."""
    res = Path(a.results)
    got = speed_rows(res)
    pj = res / "pipeline.json"
    facts = json.loads(pj.read_text()).get("facts", {}) if pj.exists() else {}
    b1 = [r for r in got["rows"] if r["batch"] == 1]
    best = max(b1, key=lambda r: r["speed_vs_plain"]) if b1 else None
    cost = next((c for c in got["costs"] if best and c["variant"] == best["variant"]), {})
    out = dict(target=TARGETS.get(a.target, a.target), gpu=facts.get("gpu"),
               sglang=facts.get("sglang"), best_batch1=best,
               break_even_accept_length=cost.get("break_even_accept_length"),
               **got, facts={k: facts.get(k) for k in ("datasets", "sizing", "training")})  # fmt: skip
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    for r in got["rows"]:
        print(f"{r['variant']:28s} batch {r['batch']:>2}: {r['tokens_per_s']:>8} tok/s, plain "
              f"{r['plain_tokens_per_s']:>8}, x{r['speed_vs_plain']}, accept {r['accept_length']}")  # fmt: skip
    for c in got["costs"]:
        print(f"{c['variant']}: round {c['round_ms']} ms, step {c['plain_step_ms']} ms, break-even "
              f"{c['break_even_accept_length']}, greedy equal {c['greedy']['equal']}/{c['greedy']['prompts']}")  # fmt: skip
    return 0
