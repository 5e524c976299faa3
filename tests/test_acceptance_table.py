"""bench/acceptance/'s tables (`python -m bench.acceptance table|curves`, run in this process:
pure logic over a results folder): one row per served engine, each drafter paired with its
controls over the same prompts, where outputs leave plain greedy, and the trainers' curves."""

import gzip
import json

import pytest
from acceptance_helpers import cli


def _serve(accepted, steps, algorithm=None, tps=100.0):
    """A served run as `python -m bench.acceptance.speculators serve --json` writes it: per held-out prompt the tokens
    accepted and the verify steps, the outputs, both speeds."""
    per = {f"p{i}": [a, s] for i, (a, s) in enumerate(zip(accepted, steps))}
    acc_len = sum(accepted) / sum(steps)
    return {
        "engine": {"speculative_algorithm": algorithm, "disable_cuda_graph": False},
        "per_prompt": per,
        "outputs": {k: [1, 2, 3] for k in per},
        "batch1": {"accept_length": acc_len, "tokens_per_s": tps},
        "batched": {"accept_length": acc_len, "tokens_per_s": tps * 4},
    }


def test_table_pairs_each_drafter_with_its_controls(tmp_path):
    """`python -m bench.acceptance table`: one row per served engine, and per kind the drafter minus
    each control over the same prompts (layer off; EAGLE-3's wrong template and its drafter on
    SpecForge's own capture, issue 44; its drafter trained by speculators on hsdump's data),
    with a paired bootstrap interval. The drafter accepts
    more on every prompt here, so every interval lies above 0; a lone control gives no line.
    Each pair names the two steps served; a control served from another step (its trainer
    failed) is said to be, in the JSON and on its line. A drafter whose engine reported its
    verify steps by drafts accepted gets, per draft step, the served acceptance beside its
    trainer's held-out accuracy (where the served accept length falls short of the prediction)."""
    res = tmp_path / "res"
    res.mkdir()
    steps = [10] * 12
    runs = {
        "plain": _serve([0] * 12, steps),
        "eagle3-default": _serve([20 + i % 3 for i in range(12)], steps, "EAGLE3"),
        "eagle3-layer_off": _serve([5] * 12, steps, "EAGLE3"),
        "eagle3-template": _serve([8] * 12, steps, "EAGLE3"),
        "eagle3-specforge": _serve([15 + i % 2 for i in range(12)], steps, "EAGLE3"),
        "eagle3-speculators": _serve([18] * 12, steps, "EAGLE3"),
        "dflash-layer_off": _serve([5] * 12, steps, "DFLASH"),  # no drafter row: no line
        # DSpark's drafter again in cap-accept mode: a row of its own, no pair
        "dspark-default-cap_accept": dict(
            _serve([12] * 12, steps, "DSPARK"), ragged_verify_mode="cap-accept"
        ),  # fmt: skip
    }
    # SGLang's verify steps by drafts accepted, per prompt (EAGLE-3 at 3 draft steps); one
    # prompt reports none
    runs["eagle3-default"]["per_prompt_drafts"] = {f"p{i}": [4, 3, 2, 1] for i in range(1, 12)}
    runs["eagle3-default"]["per_prompt_drafts"]["p0"] = []
    # SGLang's per-request figures, each per verify step: the totals weigh them by steps
    cap = runs["dspark-default-cap_accept"]
    cap["per_prompt"]["p0"][1] = 30  # 30 verify steps: 3x the weight of the others
    cap["per_prompt_cap"] = {f"p{i}": [1.4, 4.0] for i in range(12)}
    cap["per_prompt_cap"]["p0"] = [2.7, None]  # no verify length reported for p0
    for i, (name, r) in enumerate(runs.items()):  # recorded runs keep theirs gzipped
        if i % 2:
            (res / f"serve-{name}.json.gz").write_bytes(gzip.compress(json.dumps(r).encode()))
        else:
            (res / f"serve-{name}.json").write_text(json.dumps(r))
    # the step each was served from (run-all's train-*.json): the wrong-template control's
    # trainer failed at step 760, so it was served from its step-711 checkpoint, the others
    # from their last; speculators' trainer counts epochs
    served = {"default": 2370, "layer_off": 2370, "template": 711, "specforge": 2370,
              "speculators": "epoch 5"}  # fmt: skip
    for k, v in served.items():
        (res / f"train-eagle3-{k}.json").write_text(json.dumps(dict(served_step=v)))
    # the drafter's held-out accuracy per TTT step at the served step (SpecForge's eval; seven
    # steps trained, three served)
    ev = {"step": 2370, "eval/per_position_acc": [0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]}
    (res / "train-eagle3-default.json").write_text(json.dumps(dict(served_step=2370, eval=ev)))
    out = tmp_path / "table.json"
    p = cli("table", "--results", res, "--json", out)
    assert p.returncode == 0, p.stderr
    t = json.loads(out.read_text())
    assert sorted(r["variant"] for r in t["rows"]) == sorted(runs)
    pairs = t["drafter_minus_control"]
    assert sorted(pairs) == ["eagle3", "eagle3-specforge", "eagle3-speculators", "eagle3-template"]
    d = sum(20 + i % 3 for i in range(12)) / 120
    want = {"eagle3": d - 0.5, "eagle3-template": d - 0.8,
            "eagle3-specforge": d - sum(15 + i % 2 for i in range(12)) / 120,
            "eagle3-speculators": d - 1.8}  # fmt: skip
    for k, x in pairs.items():
        assert x["default_minus_this"] == pytest.approx(want[k], abs=1e-4), k
        assert 0 < x["ci95"][0] <= x["ci95"][1], (k, x)
        assert x["prompts"] == 12 and x["prompts_default_higher"] == 12
    assert "eagle3-specforge: drafter - control" in p.stdout
    same = {k: (x["served_steps"], x["same_step"]) for k, x in pairs.items()}
    assert same == {"eagle3": ([2370, 2370], True), "eagle3-template": ([2370, 711], False),
                    "eagle3-specforge": ([2370, 2370], True),
                    "eagle3-speculators": ([2370, "epoch 5"], None)}, same  # fmt: skip
    lines = [x for x in p.stdout.splitlines() if "NOT the same step" in x]
    assert len(lines) == 1 and lines[0].startswith("eagle3-template: drafter - control")
    assert lines[0].endswith("NOT the same step: drafter at 2370, control at 711"), lines
    cap = next(r for r in t["rows"] if r["variant"] == "dspark-default-cap_accept")
    assert cap["ragged_verify_mode"] == "cap-accept"
    assert cap["block_accept_length"] == pytest.approx((2.7 * 30 + 1.4 * 110) / 140, abs=1e-4)
    assert cap["cap_length"] == 4.0  # the prompts that report one
    assert cap["accept_length"] == 1.2 and "1.200 capped by its confidence head" in p.stdout
    assert {r["ragged_verify_mode"] for r in t["rows"] if r is not cap} == {"static"}
    # per draft step, served: of the 110 verify steps, 66 accepted the first draft, 33 of those
    # the second, 11 of those the third; beside the trainer's accuracy at its three served steps
    d = next(r for r in t["rows"] if r["variant"] == "eagle3-default")
    assert d["served_drafts"] == {
        "histogram": [44, 33, 22, 11],
        "step_acceptance": [0.6, 0.5, 0.3333],
        "accept_length": 2.0,
    }
    assert d["trainer_step_accuracy"] == [0.8, 0.7, 0.6]
    assert (
        "eagle3-default: per draft step, served 0.600/0.500/0.333 (of the verify steps that "
        "reached it); the trainer's held-out accuracy 0.800/0.700/0.600"
    ) in p.stdout
    assert [r["variant"] for r in t["rows"] if r["served_drafts"]] == ["eagle3-default"]


def _kinds(*args):
    """`python -m bench.acceptance ARGS` in this process (pure logic), which exits 0."""
    p = cli(*args)
    assert p.returncode == 0, p.stderr
    return p


def test_divergence_from_plain_greedy_names_near_ties(tmp_path):
    """Where a drafter's greedy outputs leave the plain target's: the first differing token,
    the plain target's own top-1 minus top-2 logprob there (`serve --margins`), and whether the
    drafter took the runner-up. Here prompt p0 is equal, p1 flips a near tie (0.02 nats) to the
    runner-up at position 2, p2 leaves at position 1 where the target was sure (3.0 nats) for a
    token that was not its runner-up: one numerics-like divergence, one fault-like."""
    res = tmp_path / "res"
    res.mkdir()
    plain = _serve([0] * 3, [10] * 3)
    plain["outputs"] = {"p0": [5, 6, 7, 8], "p1": [5, 6, 7, 8], "p2": [5, 6, 7, 8]}
    plain["plain_margins"] = {
        k: [[1.0, 9], [3.0, 9], [0.02, 70], [1.0, 9]] for k in plain["outputs"]
    }
    plain["outputs_batch1"] = {"p0": [5, 6, 7, 8]}
    drafter = _serve([20] * 3, [10] * 3, "DFLASH")
    drafter["outputs"] = {"p0": [5, 6, 7, 8], "p1": [5, 6, 70, 1], "p2": [5, 40, 7, 8]}
    drafter["outputs_batch1"] = {"p0": [5, 6, 7, 9]}
    for name, r in (("plain", plain), ("dflash-default", drafter)):
        (res / f"serve-{name}.json").write_text(json.dumps(r))
    out = tmp_path / "t.json"
    p = _kinds("table", "--results", res, "--json", out)
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    d = rows["dflash-default"]["divergence"]
    assert (d["equal"], d["diverged"], d["near_ties"], d["took_runner_up"]) == (1, 2, 1, 1), d
    assert sorted((f["prompt"], f["position"], f["margin"]) for f in d["first"]) == [
        ("p1", 2, 0.02), ("p2", 1, 3.0)]  # fmt: skip
    assert d["max_margin"] == 3.0 and d["near"] == 0.25
    assert d["batch1_equal_to_own_batched"] == "0/1"
    assert d["batch1"]["diverged"] == 1 and d["batch1"]["first"][0]["margin"] == 1.0
    assert rows["plain"]["divergence"]["batch1_equal_to_own_batched"] == "1/1"
    assert rows["plain"]["divergence"]["batch1"]["diverged"] == 0
    assert "2 of 3 outputs leave plain greedy" in p.stdout


def test_the_control_on_its_own_layers_is_paired_with_it(tmp_path):
    """run-all --control-own-layers serves the layer-off control a second time on the layers it
    trained on (`KIND-layer_off_own`): the table pairs the drafter with it too, and says what
    reading the drafter's layers cost the control (its own-layers row minus its row), over the
    same prompts; the own row's served step is the control's (its train-*.json)."""
    res = tmp_path / "res"
    res.mkdir()
    steps = [10] * 8
    runs = {"plain": _serve([0] * 8, steps),
            "dspark-default": _serve([6] * 8, steps, "DSPARK"),
            "dspark-layer_off": _serve([4] * 4 + [5] * 4, steps, "DSPARK"),
            "dspark-layer_off_own": _serve([5] * 4 + [7] * 4, steps, "DSPARK")}  # fmt: skip
    for name, r in runs.items():
        (res / f"serve-{name}.json").write_text(json.dumps(r))
    for name in ("default", "layer_off", "layer_off_own"):
        (res / f"train-dspark-{name}.json").write_text(json.dumps(dict(served_step=824)))
    out = tmp_path / "t.json"
    p = _kinds("table", "--results", res, "--json", out)
    t = json.loads(out.read_text())
    pairs, own = t["drafter_minus_control"], t["control_own_minus_off"]
    assert sorted(pairs) == ["dspark", "dspark-layer_off_own"] and sorted(own) == ["dspark"]
    assert pairs["dspark"]["default_minus_this"] == pytest.approx(0.6 - 0.45)
    assert pairs["dspark-layer_off_own"]["default_minus_this"] == pytest.approx(0.0)
    assert pairs["dspark-layer_off_own"]["served_steps"] == [824, 824]
    x = own["dspark"]
    assert x["default_minus_this"] == pytest.approx(0.6 - 0.45) and x["prompts"] == 8
    assert x["prompts_default_higher"] == 8 and 0 < x["ci95"][0] <= x["ci95"][1]
    assert "dspark: the control on its own layers - on the drafter's +0.150" in p.stdout


def test_without_a_plain_run_nothing_is_compared_with_it(tmp_path):
    """A results folder whose plain engine failed (2026-12-06: its KV pool lost to the engines
    starting beside it): the drafters' rows say nothing of plain greedy (None, printed "-"),
    rather than 0 of 256 outputs equal to a run that did not happen."""
    res = tmp_path / "res"
    res.mkdir()
    drafter = _serve([20] * 2, [10] * 2, "EAGLE3")
    drafter["outputs"] = {"p0": [5, 6], "p1": [5, 7]}
    (res / "serve-eagle3-layer_off.json").write_text(json.dumps(drafter))
    out = tmp_path / "t.json"
    p = _kinds("table", "--results", res, "--json", out)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["accept_length"] is not None
    assert (row["equal_to_plain"], row["mean_common_prefix"], row["divergence"]) == (
        None,
        None,
        None,
    )
    assert "0/2" not in p.stdout and "leave plain greedy" not in p.stdout


def test_curves_set_each_epochs_training_windows_beside_its_evaluation(tmp_path):
    """`python -m bench.acceptance curves`: per trainer log of a results folder, the mean of the
    logged training windows of each epoch (an epoch's steps from the run's pipeline.json) beside
    the held-out evaluation at its end, and the evaluations as logged; a log whose epoch length
    is known nowhere is refused by name."""
    res = tmp_path / "res"
    res.mkdir()
    lines = []
    for step in range(2, 13, 2):  # 3 epochs of 4 steps, a window and an evaluation every 2
        lines += [
            f"step {step}: {{'acc': {step / 100}, 'tau_probabilistic': {1 + step / 10}}}",
            f"step {step}: {{'eval/avg_loss': {3 - step / 10}, 'eval/avg_acc': {step / 200}}}",
        ]
    lines.insert(3, "a line SpecForge's tracker did not write")
    (res / "sf-train-dspark-default.log").write_text("\n".join(lines) + "\n")
    (res / "pipeline.json").write_text(json.dumps(
        {"facts": {"training": {"dspark": {"steps_per_epoch": 4}}}}))  # fmt: skip
    out = tmp_path / "curves.json"
    cmd = ["curves", "--results", res, "--json", out]
    p = cli(*cmd)
    assert p.returncode == 0, p.stderr
    got = json.loads(out.read_text())["dspark-default"]
    assert got["steps_per_epoch"] == 4
    assert [e["step"] for e in got["eval_curve"]] == [2, 4, 6, 8, 10, 12]
    assert got["epochs"] == [
        dict(epoch=1, windows=2, train_acc=0.03, train_tau=1.3, eval_step=4, eval_acc=0.02, eval_loss=2.6),
        dict(epoch=2, windows=2, train_acc=0.07, train_tau=1.7, eval_step=8, eval_acc=0.04, eval_loss=2.2),
        dict(epoch=3, windows=2, train_acc=0.11, train_tau=2.1, eval_step=12, eval_acc=0.06, eval_loss=1.8),
    ]  # fmt: skip
    (res / "pipeline.json").unlink()
    p = cli(*cmd)
    assert p.returncode != 0 and "sf-train-dspark-default.log" in p.stderr
    assert "--steps-per-epoch" in p.stderr
    p = cli(*cmd, "--steps-per-epoch", "6")
    assert p.returncode == 0, p.stderr
    epochs = json.loads(out.read_text())["dspark-default"]["epochs"]
    assert [e["train_acc"] for e in epochs] == [0.04, 0.1]
