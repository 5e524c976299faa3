"""bench/acceptance/'s plans (`python -m bench.acceptance disk-plan|plan|trace|fit`, and run-all's
deadline, run in this process: pure logic): what a run holds on disk, the backend and epochs a
kind trains with, a profiler trace by kernel, what one session holds, when the trainings stop."""

import json

import pytest
from acceptance_helpers import cli


def test_disk_plan_refuses_a_run_the_hosts_disk_cannot_hold(tmp_path):
    """`python -m bench.acceptance disk-plan` (what run-all checks right after its first capture): the
    peak of the plan from the capture's index and manifest (SmolLM2's shape: 30 layers of 576,
    4,000 samples of 450 tokens, the union of every kind's 6 layers and both final states), the
    captures released once no later step reads them. DFlash alone: the first capture, the
    controls' (DFlash's 5 layers one off, no final state) and one export of 5 layers, counted
    here; every kind with SpecForge's reference capture does not fit 58 GB: exit 2, naming the
    --samples that would."""
    H, T = 576, 4000 * 450
    cap = tmp_path / "default"
    cap.mkdir()
    capture = T * (8 * H * 2 + 16)
    (cap / "index.json").write_text(json.dumps(
        {"samples": {"length": [450] * 4000}, "shards": {"bytes": [capture]}}))  # fmt: skip
    (cap / "manifest.json").write_text(json.dumps(
        {"layers": [2, 15, 27, 9, 21, 28], "final": ["pre_norm", "post_norm"],
         "model": {"num_hidden_layers": 30, "hidden_size": H}}))  # fmt: skip

    def plan(*args):
        return cli("disk-plan", "--capture", cap, "--disk-gb", "58", *args)

    p = plan("--kinds", "dflash")
    assert p.returncode == 0, p.stderr
    five = T * (5 * H * 2 + 16)  # DFlash's rows: the controls' capture and each export
    assert json.loads(p.stdout)["peak_gb"] == pytest.approx((capture + 2 * five) / 1e9, abs=0.06)
    p = plan("--kinds", "dflash,eagle3,dspark", "--reference-batch", "32")
    assert p.returncode == 2, p.stdout
    assert "at eagle3's step" in p.stderr and "--samples" in p.stderr, p.stderr
    # EAGLE-3 with SpecForge's capture (equal lengths: its batches carry no padding), 4 slots a
    # row in each control and export: one after the other, the peak is every capture beside the
    # first export (each capture goes after its own); with --overlap, SpecForge's capture and
    # the default's export are written while every capture is held
    four = T * (4 * H * 2 + 16)
    p = plan("--kinds", "eagle3", "--reference-batch", "8")
    assert json.loads(p.stdout)["peak_gb"] == pytest.approx((capture + 3 * four) / 1e9, abs=0.06)
    p = plan("--kinds", "eagle3", "--reference-batch", "8", "--overlap")
    facts = json.loads(p.stdout)
    assert facts["peak_gb"] == pytest.approx((capture + 4 * four) / 1e9, abs=0.06), facts
    assert set(facts["peak_parts"]) == {"default", "layer_off", "template", "export default",
                                        "SpecForge capture"}  # fmt: skip
    # the drafter alone (run-all --no-controls): its capture beside its one export
    p = plan("--kinds", "eagle3", "--no-controls")
    facts = json.loads(p.stdout)
    assert facts["peak_gb"] == pytest.approx((capture + four) / 1e9, abs=0.06), facts
    assert set(facts["peak_parts"]) == {"default", "export default"}


def _kinds(*args):
    """`python -m bench.acceptance ARGS` in this process (pure logic), which exits 0."""
    p = cli(*args)
    assert p.returncode == 0, p.stderr
    return p


def test_training_plan_from_the_probe(tmp_path):
    """run-all's plan for a kind: `auto` takes the probe's faster backend (sdpa where the other
    failed or none ran), and --epochs-fit as many epochs as the budget holds at twice the
    probe's step (drafter and control share the GPU), never fewer than --epochs."""
    probe = {"faster": "flex_attention", "backends": {
        "sdpa": {"rc": 0, "step_time": {"step_s": 0.5}},
        "flex_attention": {"rc": 0, "step_time": {"step_s": 0.2}}}}  # fmt: skip
    f = tmp_path / "probe.json"
    f.write_text(json.dumps(probe))
    common = ["plan", "--probe", f, "--records", 2100, "--eval-samples", 100, "--batch-size", 8,
              "--train-budget-s", 860]  # fmt: skip
    plan = json.loads(_kinds(*common, "--epochs", 3, "--epochs-fit").stdout)
    # 2000 records, 250 steps an epoch at 0.4 s a pair-step: 0.9 * 800 / 100 = 7.2 -> 7
    assert plan["attention_backend"] == "flex_attention" and plan["epochs"] == 7, plan
    assert plan["steps_per_epoch"] == 250 and plan["planned_steps"] == 1750
    plan = json.loads(_kinds(*common, "--epochs", 9, "--epochs-fit").stdout)
    assert plan["epochs"] == 9  # at least --epochs
    # with the probe's profile: a pair step is the longer of one step alone (0.2 s) and twice
    # the GPU's busy time a step (4 steps, 0.6 s busy: 0.3 s): 0.9 * 800 / (250 * 0.3) = 9.6
    probe["backends"]["flex_attention"]["profile"] = {"gpu_busy_ms": 600.0}
    f.write_text(json.dumps(probe))
    plan = json.loads(_kinds(*common, "--epochs", 3, "--epochs-fit").stdout)
    assert (plan["pair_step_s"], plan["epochs"]) == (0.3, 9), plan
    # EAGLE-3's four trainers (drafter, two controls, the drafter on SpecForge's capture) share
    # the GPU: a shared step is four times the busy time: 0.9 * 800 / (250 * 0.6) = 4.8
    plan = json.loads(_kinds(*common, "--epochs", 3, "--epochs-fit", "--side-by-side", 4).stdout)
    assert (plan["pair_step_s"], plan["epochs"], plan["side_by_side"]) == (0.6, 4, 4), plan
    assert "4 trainers side by side" in plan["epochs_from"]
    probe["backends"]["flex_attention"]["profile"] = {"gpu_busy_ms": 200.0}  # 0.1 s busy
    f.write_text(json.dumps(probe))
    plan = json.loads(_kinds(*common, "--epochs", 3, "--epochs-fit").stdout)
    assert (plan["pair_step_s"], plan["epochs"]) == (0.2, 14), plan  # the step alone bounds it
    plan = json.loads(_kinds(*common, "--epochs", 3, "--attention-backend", "sdpa").stdout)
    assert (plan["attention_backend"], plan["epochs"]) == ("sdpa", 3)  # no fit asked
    probe["faster"] = None
    f.write_text(json.dumps(probe))
    assert json.loads(_kinds(*common, "--epochs", 3).stdout)["attention_backend"] == "sdpa"


def test_trace_summary_by_kernel(tmp_path):
    """The probe's profiler trace, summarised: the window, the GPU's busy share in it, the
    kernels by time (calls counted), CPU ops apart from the Python stack events."""
    import gzip

    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 900},
        {"ph": "X", "cat": "python_function", "name": "threading.py: run", "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "kernel", "name": "flex_attention_bwd", "ts": 100, "dur": 300},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 400, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 600, "dur": 100},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 5},
    ]
    f = tmp_path / "t.trace.json.gz"
    with gzip.open(f, "wt") as fh:
        json.dump({"traceEvents": ev}, fh)
    s = json.loads(_kinds("trace", "--file", f).stdout)
    assert s["window_ms"] == 1.0 and s["gpu_busy_ms"] == 0.5 and s["gpu_busy_share"] == 0.5
    assert [(k["name"], k["ms"], k["calls"]) for k in s["kernels"]] == [
        ("flex_attention_bwd", 0.3, 1), ("gemm", 0.2, 2)]  # fmt: skip
    assert [k["name"] for k in s["cpu_ops"]] == ["aten::mm"]


def test_fit_counts_what_one_session_holds_from_a_whole_run(tmp_path):
    """`python -m bench.acceptance fit`: from a whole run's pipeline.json, the captures' and exports'
    seconds a sample (steps side by side counted once), the trainers' seconds a record and
    epoch, the rest fixed; then for each number of epochs the most samples one session's
    budget holds, and the most its disk holds. A run of two kinds is refused."""
    steps = [
        dict(name="build-target", start_s=0, wall_s=40),
        dict(name="extract-default", start_s=40, wall_s=150),
        dict(name="export-messages", start_s=190, wall_s=10),
        dict(name="extract-layer_off", start_s=200, wall_s=60),
        dict(name="export-dspark-default", start_s=260, wall_s=20),  # side by side with
        dict(name="export-dspark-layer_off", start_s=270, wall_s=20),  # its twin: 30 s
        dict(name="smoke-dspark", start_s=300, wall_s=100),  # beside the trainers: neither
        dict(name="train-dspark-default", start_s=300, wall_s=1000),
        dict(name="train-dspark-layer_off", start_s=300, wall_s=1010),
        dict(name="serve-plain", start_s=1320, wall_s=130),
    ]  # captures 150 + 10 + 60 + 30 = 250 s; training 1,010 s
    pipe = dict(steps=steps, elapsed_s=1450.0, facts=dict(
        datasets={"default": {"samples": 2100}},
        training={"dspark": {"train_records": 2000, "epochs": 5}},
        disk=dict(free_gb=60.0, margin_gb=8.0, peak_gb=21.0)))  # fmt: skip
    res = tmp_path / "res"
    res.mkdir()
    (res / "pipeline.json").write_text(json.dumps(pipe))
    cmd = ["fit", "--results", res, "--budget-s", "1800", "--before-s", "60", "--epochs", "1,5"]
    p = cli(*cmd)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert (got["capture_s"], got["train_s"], got["fixed_s"]) == (250.0, 1010.0, 250.0)
    c, t = 250 / 2100, 1010 / (2000 * 5)
    for e, row in zip((1, 5), got["fit"]):
        n = int((1800 - 250 + t * e * 100) / (c + t * e))
        # the trainers start 50 s into run-all past the captures before them (300 - 250), and
        # run-all ends 140 s after the last of them (1,450 - 1,310)
        end = 50 + c * n + t * e * (n - 100)
        assert row == dict(epochs=e, samples=n, records=n - 100,
                           steps_at_batch_8=(n - 100) * e // 8,
                           trainers_end_s=round(end), run_all_s=round(end + 140),
                           # what to pass: the trainers stopped 60 s past their end at the
                           # latest, and the bg run's deadline 140 + 80 s past that stop
                           train_end_s=round(end) + 60,
                           bg_deadline_s=round(end) + 60 + 140 + 80)  # fmt: skip
        assert 250 + c * n + t * e * (n - 100) <= 1800 < 250 + c * (n + 1) + t * e * (n + 1 - 100)
    assert got["fixed_before_trainers_s"] == 50.0 and got["fixed_after_trainers_s"] == 140.0
    # the run itself, fitted back: its own GPU time (1,450 s and the 60 before) holds its own
    # 2,100 samples at its 5 epochs, whose trainers and run-all end where they ended
    p = cli(*cmd[:-6], "--budget-s", "1510.5", "--before-s", "60", "--epochs", "5")
    assert p.returncode == 0, p.stderr
    back = json.loads(p.stdout)["fit"][0]
    assert (back["samples"], back["trainers_end_s"], back["run_all_s"]) == (2100, 1310, 1450), back
    assert (back["train_end_s"], back["bg_deadline_s"]) == (1370, 1590), back
    # a margin kept free is taken from the budget
    p = cli(*cmd[:-2], "--epochs", "5", "--margin-s", "200")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["fit"][0]["samples"] == int((1600 - 250 + t * 500) / (c + t * 5))
    assert got["disk_bytes_per_sample"] == 10_000_000 and got["disk_samples"] == 5200
    pipe["facts"]["training"]["dflash"] = pipe["facts"]["training"]["dspark"]
    (res / "pipeline.json").write_text(json.dumps(pipe))
    p = cli(*cmd)
    assert p.returncode != 0 and "one kind only" in p.stderr


def test_run_all_stops_the_trainings_before_its_deadline(tmp_path):
    """run-all --deadline-s: the trainings stop --after-train-s before it (or at --train-end-s,
    if sooner), said before any work; a deadline that leaves nothing to train is refused, and
    so is data without its held-out prompts, both before the work folder is made."""
    cmd = ["run-all", "--work", tmp_path / "w", "--data", tmp_path / "none"]
    run = lambda *a: cli(*cmd, *a)  # noqa: E731
    p = run("--deadline-s", 1000, "--after-train-s", 300, "--train-end-s", 900)
    assert "the trainings stop by 700 s into it" in p.stdout, p.stdout + p.stderr
    assert p.returncode != 0 and "holds no heldout.jsonl" in p.stderr
    p = run("--deadline-s", 1000, "--after-train-s", 300, "--train-end-s", 600)
    assert "the trainings stop by 600 s into it" in p.stdout, p.stdout + p.stderr
    p = run("--deadline-s", 1000)  # --after-train-s 300 by default
    assert "the trainings stop by 700 s into it" in p.stdout, p.stdout + p.stderr
    p = run("--deadline-s", 250)
    assert p.returncode != 0 and "leaves nothing to train" in p.stderr
    assert "BG_DEADLINE_S" in p.stderr and "the trainings stop" not in p.stdout
    assert not (tmp_path / "w").exists()
