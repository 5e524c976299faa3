"""Several jobs, one dataset, through Ray (hsdump/launch/ray.py): a real one-node Ray cluster
that the tests start on this machine (`ray start --head --block`) and stop, two extraction jobs
as Ray tasks (engine=dry: the launch, the retries and the driver's report are hsdump's) with one
of them SIGKILLed on its first attempt and re-run by Ray, and a job that uses up its retries."""

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import pytest
import ray  # noqa: F401  (pinned in requirements.lock: no skip where it is missing)
import torch
from factories import JOB_ARGS, ROOT
from harness import DRY

from hsdump.launch import ray as ray_launch
from hsdump.store.reader import HsdumpDataset

LAUNCH = ["-m", "hsdump", "ray"]


def guard():
    """`--env` for the jobs: the engine guard (tests/conftest.py) of the running test. Ray's
    tasks get the environment of the cluster, started before it, not the driver's."""
    return ["--env", f"HSDUMP_FORBID_ENGINE={os.environ['HSDUMP_FORBID_ENGINE']}"]


@pytest.fixture(scope="module")
def cluster():
    """A one-node Ray cluster (2 CPUs, no GPU) with its own temp dir, port and auth token;
    yields the environment that reaches it (RAY_ADDRESS and the token). `ray start --block`
    stops every process it started when it gets SIGTERM. (Ray replaces a loopback address by
    the machine's own IP, so the node gets that IP; hence the token.) Not through
    tests/harness.py: it runs for the whole module, its output into a file."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="hsray", dir="/tmp")  # short: Ray's socket paths live here
    log = open(Path(tmp) / "ray-start.log", "w")
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    head = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            "--num-gpus=0",
            f"--temp-dir={tmp}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--object-store-memory=100000000",
        ],
        cwd=ROOT,
        env=harness.clean_env(auth),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while "Ray runtime started" not in (Path(tmp) / "ray-start.log").read_text():
            assert head.poll() is None, (Path(tmp) / "ray-start.log").read_text()[-3000:]
            assert time.time() < deadline, "ray start did not come up in 120 s"
            time.sleep(0.5)
        yield {"RAY_ADDRESS": f"127.0.0.1:{port}", **auth}
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)  # its own session: only what it started
            head.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- no engine
def test_arguments_and_config_are_checked_before_any_task():
    assert ray_launch.split_overrides(["a=1", "dist.num_jobs=4"], None) == (["a=1"], 4)
    assert ray_launch.split_overrides(["a=1"], 3) == (["a=1"], 3)
    for bad, n in (
        (["dist.job_index=1"], 2),
        (["dist.num_jobs=2"], 3),
        ([], None),
        (["-m"], 2),
        ([], 0),
    ):
        with pytest.raises(ValueError):
            ray_launch.split_overrides(bad, n)
    # GPUs per job follow the engine: one replica of tp_size GPUs, times SGLang's dp_size
    cfg = ray_launch.compose(["model=llama3_8b", "engine=gpu"], 4)
    assert ray_launch.default_gpus(cfg) == 1
    cfg = ray_launch.compose(["model=kimi_k25", "engine=gpu"], 2)
    assert ray_launch.default_gpus(cfg) == cfg.model.tp_size == 8
    cfg = ray_launch.compose(["engine=gpu", "model.tp_size=2", "+engine.extra.dp_size=2"], 2)
    assert ray_launch.default_gpus(cfg) == 4
    assert ray_launch.default_gpus(ray_launch.compose([], 2)) == 0  # the CPU engine
    assert ray_launch.main(["--num-jobs", "2", "model.no_such_key=1"]) == 2
    assert ray_launch.main(["--num-jobs", "2", "output.overwrite=true"]) == 2
    assert ray_launch.main(["--num-jobs", "2", "--only", "2", "output.dir=/tmp/x"]) == 2
    opts = ray_launch.ray_options(
        ray_launch.parse_args(
            ["--num-cpus", "8", "--max-retries", "5", "--resources", '{"H200": 1}', "x=1"]
        ),
        1.0,
    )
    assert opts == {
        "num_cpus": 8.0,
        "num_gpus": 1.0,
        "max_retries": 5,
        "retry_exceptions": [ray_launch.JobFailed],
        "resources": {"H200": 1},
    }


def test_failed_job_is_retried_then_reported_and_relative_dirs_refused(cluster, tmp_path):
    env = cluster
    # on a cluster a relative output.dir would be each node's own folder: refused
    rc, log = harness.python(*LAUNCH, "--num-jobs", "2", "output.dir=rel/out", env=env, timeout=300)
    assert rc == 2 and "is relative" in log, log[-3000:]
    # job 1's python cannot start (exit status 1) on every attempt: 1 retry, then the driver
    # names the job and the command that re-runs it; job 0 is not run (--only)
    rc, log = harness.python(
        *LAUNCH,
        "--num-jobs",
        "2",
        "--only",
        "1",
        "--max-retries",
        "1",
        "--env",
        "PYTHONHOME=/nonexistent",
        *guard(),
        "--log-dir",
        str(tmp_path / "logs"),
        *JOB_ARGS,
        DRY,
        f"output.dir={tmp_path}/out",
        env=env,
        timeout=300,
    )
    assert rc == 1, log[-3000:]
    assert "job 1/2: FAILED (exit status 1) after 2 attempt(s)" in log, log[-3000:]
    assert "job 0/2" not in log
    assert "failed after their retries: 1" in log and "--only 1 --num-jobs 2" in log
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "job1-attempt1",
        "job1-attempt2",
    ]


# ----------------------------------------------------------------------------- jobs
def test_two_ray_jobs_write_one_dataset_one_killed_and_rerun_by_ray(cluster, tmp_path, tiny_llama):
    ref, out, logs = tmp_path / "ref", tmp_path / "out", tmp_path / "logs"
    # the reference (one plain job) runs meanwhile, into its own folder
    reference = harness.extract(
        f"hydra.run.dir={tmp_path}/run", out=ref, args=[*JOB_ARGS, DRY], wait=False
    )
    try:
        # two jobs as Ray tasks of 1 CPU each; job 1 SIGKILLs itself at its 3rd sample on its
        # first attempt only (HSDUMP_RAY_FAULT), so Ray must run it again
        rc, log = harness.python(
            *LAUNCH,
            "--num-jobs",
            "2",
            "--num-cpus",
            "1",
            *guard(),
            "--log-dir",
            str(logs),
            *JOB_ARGS,
            DRY,
            f"output.dir={out}",
            env={**cluster, "HSDUMP_RAY_FAULT": "1:sample@3"},
        )
        ref_log, _ = reference.communicate(timeout=600)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    report = log[log.rfind("python -m hsdump ray: 2 jobs in") :]  # the driver's last lines
    assert rc == 0, log[-5000:]
    assert reference.returncode == 0, ref_log[-3000:]

    # Ray re-ran the killed job: its first attempt died of the SIGKILL, a later one finished
    # (job 0 ran once, unless something else failed it: then Ray re-ran it too, as it should)
    assert re.search(r"^job 0/2: ok after \d attempt", report, re.M), report
    assert re.search(r"^job 1/2: ok after [2-4] attempt", report, re.M), report
    # each line carries the job's summary, read from the JSON it wrote (HSDUMP_SUMMARY)
    assert re.search(
        r"^job 1/2: ok after .*\| samples written: \d+, already committed before this run: "
        r"\d+ \| wall time: [\d.]+ s",
        report,
        re.M,
    ), report
    assert re.search(
        r"^job 1/2: .*\n +attempt 1 on \S+: killed by SIGKILL after \d+ s; "
        r"attempt 2 on \S+: ok",
        report,
        re.M,
    ), report
    assert {"job0-attempt1", "job1-attempt1", "job1-attempt2"} <= {
        p.name for p in logs.iterdir()
    }, report
    first = (logs / "job1-attempt1" / "output.log").read_text()
    again = (logs / "job1-attempt2" / "output.log").read_text()
    assert "samples written:" not in first, first[-2000:]  # killed before its summary
    assert "samples written:" in again and "already committed before this run:" in again, again[
        -3000:
    ]

    # one dataset: every sample exactly once, equal to the single-job run
    rc, vlog = harness.python("-m", "hsdump", "verify", str(out))
    assert rc == 0, vlog[-3000:]
    da, db = HsdumpDataset(str(out), allow_dry=True), HsdumpDataset(str(ref), allow_dry=True)
    assert len(da.ids) == len(set(da.ids)) >= 8, da.ids
    assert sorted(da.ids) == sorted(db.ids), (da.ids, db.ids)
    assert {i % 2 for i in da.ids} == {0, 1}  # both jobs' samples
    for sid in da.ids:
        ra, rb = da.get(sid), db.get(sid)
        assert torch.equal(ra["input_ids"], rb["input_ids"]), sid
        assert torch.equal(ra["loss_mask"], rb["loss_mask"]), sid
        for j, (x, y) in enumerate(zip(ra["hidden_states"], rb["hidden_states"])):
            assert torch.equal(x, y), (sid, j)  # the dry engine's rows: a function of the ids


# ----------------------------------------------------------------------------- engines of 2 nodes
def test_engine_over_two_nodes_runs_one_task_per_node_with_its_rank(tmp_path):
    """dist.nodes_per_engine=2: each job's engine gets a placement group of one bundle per node
    (STRICT_SPREAD, on a real two-node Ray cluster simulated on this machine) and one task per
    node with the same command plus engine.nnodes=2, its node_rank and node 0's address. The
    jobs' python cannot start here (PYTHONHOME), so each task fails at once: the driver reports
    the job FAILED, after both nodes' tasks ran, without retrying a node alone."""
    from ray.cluster_utils import Cluster

    spec = ray_launch.JobSpec(
        index=1,
        num_jobs=2,
        overrides=["model=kimi_k25"],
        nodes=2,
        rank=1,
        dist_init_addr="10.0.0.5:29500",
        log_dir="L",
    )
    cmd = spec.command(1)
    for o in (
        "dist.num_jobs=2",
        "dist.job_index=1",
        "dist.nodes_per_engine=2",
        "engine.nnodes=2",
        "engine.node_rank=1",
        "engine.dist_init_addr=10.0.0.5:29500",
    ):
        assert o in cmd, (o, cmd)
    assert spec.attempt_dir(1) == "L/job1-node1-attempt1"
    with pytest.raises(ValueError, match="dist.nodes_per_engine"):
        ray_launch.split_overrides(["engine.node_rank=1"], 2)
    cfg = ray_launch.compose(
        [
            "model=kimi_k25",
            "engine=gpu",
            "model.tp_size=16",
            "dist.nodes_per_engine=2",
            "+engine.extra.dp_size=16",
            "+engine.extra.enable_dp_attention=true",
        ],
        2,
    )
    assert ray_launch.default_gpus(cfg) == 8  # 16 GPUs of the engine over 2 nodes

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        env = {"RAY_ADDRESS": cluster.address}
        rc, log = harness.python(
            *LAUNCH,
            "--num-jobs",
            "1",
            "--num-cpus",
            "1",
            "--env",
            "PYTHONHOME=/nonexistent",
            *guard(),
            "--log-dir",
            str(tmp_path / "logs"),
            "dist.nodes_per_engine=2",
            *JOB_ARGS,
            DRY,
            f"output.dir={tmp_path}/out",
            env=env,
            timeout=300,
        )
    finally:
        cluster.shutdown()
    assert rc == 1, log[-3000:]
    assert "job 0/1: FAILED (exit status 1)" in log, log[-3000:]
    for rank in (0, 1):
        assert re.search(
            rf"engine\.nnodes=2 engine\.node_rank={rank} "
            r"engine\.dist_init_addr=[\d.]+:\d+",
            log,
        ), log[-3000:]
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "job0-node0-attempt1",
        "job0-node1-attempt1",
    ]
