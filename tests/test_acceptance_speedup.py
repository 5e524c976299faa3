"""The speed table of a run-all with --serve-settings (bench/acceptance/speedup.py): rows,
the cost of a round against a plain step, the break-even accept length, greedy agreement."""

import json
import sys
from argparse import Namespace

import pytest
from factories import ROOT

sys.path.insert(0, str(ROOT))

from bench.acceptance.speedup import (  # noqa: E402
    agreement,
    first_difference,
    over_run,
    speed_rows,
    speedup,
)


def _row(name, b1_wall, b1_tokens, per_prompt, b8, outputs, batched=None):
    return dict(
        name=name,
        batched=batched or dict(tokens_per_s=1000.0, accept_length=None),
        batch1=dict(
            prompts=len(per_prompt),
            completion_tokens=b1_tokens,
            wall_s=b1_wall,
            tokens_per_s=round(b1_tokens / b1_wall, 1),
            per_prompt=per_prompt,
            accept_length=None,
        ),  # fmt: skip
        batch8=b8,
        outputs_batch1=outputs,
    )


def _write(tmp_path):
    # plain: 400 tokens in 0.8 s at batch 1 -> 2 ms a step
    plain = _row("plain", 0.8, 400, [[200, 0, 0.3], [200, 0, 0.5]],
                 dict(prompts=2, tokens_per_s=800.0, accept_length=None),
                 {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8]})  # fmt: skip
    # drafter: the same 400 tokens in 0.5 s over 160 verify steps -> 3.125 ms a round, accept 2.5
    fast = _row("eagle3-default-s3-1-4", 0.5, 400, [[200, 80, 0.2], [200, 80, 0.3]],
                dict(prompts=2, tokens_per_s=1200.0, accept_length=2.4),
                {"a": [1, 2, 3, 4], "b": [5, 6, 9, 8]})  # fmt: skip
    slow = _row("eagle3-default-s2-1-3", 1.0, 400, [[200, 100], [200, 100]],
                dict(prompts=2, tokens_per_s=700.0, accept_length=2.0),
                {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8]})  # fmt: skip
    for r in (plain, fast, slow):
        (tmp_path / f"serve-{r['name']}.json").write_text(json.dumps(r))
    (tmp_path / "serve-eagle3-layer_off.json").write_text(json.dumps(fast))  # not a setting
    (tmp_path / "margins.json").write_text(json.dumps(
        {"rows": {"eagle3-default-s3-1-4": {"b": {"position": 2, "margin": 0.03}}}}))  # fmt: skip
    (tmp_path / "pipeline.json").write_text(json.dumps(
        {"facts": {"gpu": "NVIDIA H100 80GB HBM3", "sglang": "0.5.17"}}))  # fmt: skip


def test_first_difference_and_agreement():
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert first_difference([1, 2], [1, 2, 3]) is None
    ag = agreement({"outputs_batch1": {"a": [1, 2], "b": [3, 4]}},
                   {"outputs_batch1": {"a": [1, 2], "b": [3, 5]}})  # fmt: skip
    assert ag == dict(prompts=2, equal=1, first_difference={"b": 1})


def test_speed_rows_cost_and_break_even(tmp_path):
    _write(tmp_path)
    got = speed_rows(tmp_path)
    assert got["plain"]["step_ms"] == 2.0
    rows = {(r["variant"], r["batch"]): r for r in got["rows"]}
    assert set(rows) == {("eagle3-default-s3-1-4", 1), ("eagle3-default-s3-1-4", 8),
                         ("eagle3-default-s2-1-3", 1), ("eagle3-default-s2-1-3", 8)}  # fmt: skip
    r = rows[("eagle3-default-s3-1-4", 1)]
    assert r["speed_vs_plain"] == 1.6 and (r["steps"], r["topk"], r["draft_tokens"]) == (3, 1, 4)
    assert rows[("eagle3-default-s3-1-4", 8)]["speed_vs_plain"] == 1.5
    assert rows[("eagle3-default-s2-1-3", 1)]["speed_vs_plain"] == 0.8
    cost = {c["variant"]: c for c in got["costs"]}["eagle3-default-s3-1-4"]
    # one round 0.5 s / 160 = 3.125 ms; one plain step 2 ms; break-even 1.5625
    assert cost["round_ms"] == 3.125 and cost["break_even_accept_length"] == 1.562
    assert cost["accept_length_for_1_3x"] == round(1.3 * 3.125 / 2, 3)
    assert cost["greedy"]["equal"] == 1 and cost["greedy"]["prompts"] == 2
    # each prompt's own round and step times (its wall seconds over its rounds or tokens);
    # rows written before those were kept (two numbers a prompt) have none
    assert cost["round_ms_by_prompt"] == dict(median=3.75, p10=2.5, p90=3.75, max=3.75)
    assert got["plain"]["step_ms_by_prompt"] == dict(median=2.5, p10=1.5, p90=2.5, max=2.5)
    assert (
        "round_ms_by_prompt" not in {c["variant"]: c for c in got["costs"]}["eagle3-default-s2-1-3"]
    )
    assert cost["greedy"]["margins_at_first_difference"]["n"] == 1
    assert cost["greedy"]["margins_at_first_difference"]["under_0_1"] == 1


def test_a_setting_with_the_collector_frozen_is_a_row_of_its_own(tmp_path):
    """run-all's --serve-settings '3,1,4;3,1,4,gc': the second engine serves with --freeze-gc,
    under its own name, and its rows say so; a malformed setting is refused before the run."""
    from bench.acceptance.run_all import setting_item

    d = tmp_path / "served"
    assert setting_item("eagle3-default", "3,1,4", d) == (
        "eagle3-default-s3-1-4", "EAGLE3", d, ["--spec", "3,1,4"])  # fmt: skip
    assert setting_item("eagle3-default", "3,1,4,gc", d) == (
        "eagle3-default-s3-1-4-gc", "EAGLE3", d, ["--spec", "3,1,4", "--freeze-gc"])  # fmt: skip
    for bad in ("3,1", "3,1,4,xx", "a,1,4"):
        with pytest.raises(SystemExit, match="STEPS,TOPK,TOKENS"):
            setting_item("eagle3-default", bad, d)
    _write(tmp_path)
    frozen = json.loads((tmp_path / "serve-eagle3-default-s3-1-4.json").read_text())
    frozen.update(name="eagle3-default-s3-1-4-gc", freeze_gc=True)
    (tmp_path / "serve-eagle3-default-s3-1-4-gc.json").write_text(json.dumps(frozen))
    rows = {(r["variant"], r["batch"]): r for r in speed_rows(tmp_path)["rows"]}
    assert rows[("eagle3-default-s3-1-4-gc", 1)]["freeze_gc"] is True
    assert rows[("eagle3-default-s3-1-4-gc", 1)]["steps"] == 3
    assert "freeze_gc" not in rows[("eagle3-default-s3-1-4", 1)]


def test_over_run_gives_each_stretch_of_the_full_length_prompts():
    """A round that slows down over the run shows stretch by stretch; the prompts that stopped
    short (their request's fixed cost spread over fewer rounds) are left out."""
    # 8 prompts in serving order: 6 ran to 192 tokens, rounds of 3, 3, 4, 4, 6, 6 ms;
    # two stopped at 20 tokens with slow rounds that must not count
    pp = [[192, 100, 0.3], [20, 5, 0.2], [192, 100, 0.3], [192, 100, 0.4],
          [192, 100, 0.4], [20, 5, 0.2], [192, 100, 0.6], [192, 100, 0.6]]  # fmt: skip
    got = over_run(pp, 1)
    assert got["completion_tokens"] == 192
    assert [s["median"] for s in got["stretches"]] == [3.0, 4.0, 4.0, 6.0]
    assert [s["prompts"] for s in got["stretches"]] == [1, 2, 1, 2]
    assert over_run(pp, 1, parts=2)["stretches"] == [dict(prompts=3, median=3.0),
                                                     dict(prompts=3, median=6.0)]  # fmt: skip
    assert over_run([[192, 100], [192, 90]], 1) is None  # rows without wall times


def test_speedup_json_names_target_gpu_and_best(tmp_path):
    _write(tmp_path)
    out = tmp_path / "speedup.json"
    assert speedup(Namespace(results=str(tmp_path), target="qwen2.5-coder:1.5b-instruct",
                             json=str(out))) == 0  # fmt: skip
    j = json.loads(out.read_text())
    assert "1.5B" in j["target"] and j["gpu"].startswith("NVIDIA H100")
    assert j["sglang"] == "0.5.17"
    assert j["best_batch1"]["variant"] == "eagle3-default-s3-1-4"
    assert j["break_even_accept_length"] == 1.562
    keys = {"variant", "batch", "prompts", "tokens_per_s", "plain_tokens_per_s",
            "speed_vs_plain", "accept_length", "steps", "topk", "draft_tokens"}  # fmt: skip
    assert all(keys <= set(r) for r in j["rows"])


@pytest.mark.parametrize(
    "run",
    [
        "speedup-qwen-coder-1.5b-0517",
        "speedup-qwen-coder-1.5b-0517-h200",
        "speedup-qwen-coder-1.5b-0517-h100-alone",
        "speedup-qwen-coder-1.5b-0517-turns-gc",
    ],
)
def test_recorded_run_is_its_serve_files(tmp_path, run):
    """The recorded 1.5B runs' speedup.json is what their gzipped serve JSONs and margins give."""
    res = ROOT / "bench" / "results" / run
    out = tmp_path / "speedup.json"
    assert speedup(Namespace(results=str(res), target="qwen2.5-coder:1.5b-instruct",
                             json=str(out))) == 0  # fmt: skip
    got, rec = json.loads(out.read_text()), json.loads((res / "speedup.json").read_text())
    assert got["rows"] == rec["rows"] and got["costs"] == rec["costs"]
    assert got["break_even_accept_length"] == rec["break_even_accept_length"]
    assert {r["batch"] for r in rec["rows"]} == {1, 8, 32}
    assert all(r["prompts"] == 128 for r in rec["rows"])
