"""Several jobs, one dataset: Hydra launcher presets (conf/hydra/launcher, conf/dist) and real
jobs through hydra-submitit-launcher's local executor, one of them killed and re-run alone
(engine=dry: the launcher, the split and resume are hsdump's), and SGLang's data parallelism
on the real CPU engine (what SGLang decides: which replica runs which sample)."""

import glob
import os
import re
from pathlib import Path

import harness
import pytest
import torch
from factories import (
    JOB_ARGS,
    committed,
    compose_config,
    hf_hidden_states,
    shard_mtimes,
    shards,
    skipped,
)
from harness import DRY
from tolerance import per_sample_ok, rel_err

from hsdump.config import register_configs, to_config
from hsdump.store.reader import HsdumpDataset

register_configs()

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")

MULTIRUN = "hydra.mode=MULTIRUN"  # `extract.py -m` (harness.extract puts its overrides first)


def config(*overrides, hydra=True):
    return compose_config(*overrides, hydra=hydra)


def job_logs(sweep_dir):
    """stdout + stderr of every submitit job of a sweep, in job-id order."""
    out = []
    for f in sorted(glob.glob(f"{sweep_dir}/.submitit/*/*_0_log.*")):
        out.append(Path(f).read_text(errors="replace"))
    return "\n".join(out)


# ----------------------------------------------------------------------------- presets
def test_launcher_presets_compose():
    c = config("hydra/launcher=slurm_node", "model=kimi_k25", "engine=gpu")
    launcher = c.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.nodes) == (8, 1, 1)
    assert launcher.name == "hsdump-kimi-k2.5" and launcher.max_num_timeout > 0
    assert launcher.additional_parameters == {"exclusive": True}
    c = config("hydra/launcher=slurm_gpu")
    assert c.hydra.launcher.gpus_per_node == 1 and c.hydra.launcher._target_.endswith(
        "SlurmLauncher"
    )
    c = config("hydra/launcher=local_jobs")
    assert c.hydra.launcher._target_.endswith("LocalLauncher")

    # +dist presets: the launcher and the sweep over dist.job_index in one word
    c = config("+dist=slurm_nodes", "dist.num_jobs=4")
    assert c.hydra.launcher.gpus_per_node == 8
    assert c.hydra.sweeper.params["dist.job_index"] == "range(4)"
    c = config("+dist=slurm_nodes")  # one job unless dist.num_jobs says more
    assert c.dist.num_jobs == 1 and c.hydra.sweeper.params["dist.job_index"] == "range(1)"
    c = config("+dist=slurm_gpus", "dist.num_jobs=16")
    assert c.hydra.launcher.gpus_per_node == 1
    assert c.hydra.sweeper.params["dist.job_index"] == "range(16)"
    c = config("+dist=node_gpus", "dist.job_index=5", "engine=gpu", "model=llama3_8b")
    assert c.hydra.launcher._target_.endswith("LocalLauncher")
    assert c.hydra.launcher.gpus_per_node == 8
    task = to_config(config("+dist=node_gpus", "dist.job_index=5", hydra=False))
    assert task.engine.extra == {"base_gpu_id": 5}  # job i runs on GPU i of 0..num_jobs-1
    c = config("+dist=local_jobs")
    assert c.dist.num_jobs == 2 and c.hydra.sweeper.params["dist.job_index"] == "range(2)"


def sbatch_stand_in(tmp_path):
    """(env, folder): a PATH whose `sbatch` copies the script hydra-submitit-launcher wrote
    into the folder, then refuses (so nothing runs), and whose `srun` exists."""
    bin_dir, rec = tmp_path / "bin", tmp_path / "rec"
    bin_dir.mkdir()
    rec.mkdir()
    (bin_dir / "sbatch").write_text(
        '#!/bin/sh\ncp "$1" "$REC/script.sh"\necho "sbatch: error: test stand-in" >&2\nexit 1\n'
    )
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "REC": str(rec)}, rec


def test_slurm_sweep_submits_one_array_task_per_job(tmp_path):
    """The real command line down to sbatch: a stand-in `sbatch` records the script that
    hydra-submitit-launcher wrote, then refuses, so nothing runs and no cluster is needed."""
    env, rec = sbatch_stand_in(tmp_path)
    rc, log = harness.extract(
        MULTIRUN,
        "+dist=slurm_nodes",
        "dist.num_jobs=3",
        "model=kimi_k25",
        "engine=gpu",
        "hydra.launcher.partition=gpu",
        f"hydra.sweep.dir={tmp_path}/sweep",
        env=env,
        timeout=300,
    )
    assert rc != 0 and "test stand-in" in log, log[-3000:]
    jobs = re.findall(r"#(\d+) : (.*)", log)
    assert [int(n) for n, _ in jobs] == [0, 1, 2]
    for n, overrides in jobs:
        assert f"dist.job_index={n}" in overrides.split() and "dist.num_jobs=3" in overrides
    script = (rec / "script.sh").read_text()
    for line in (
        "--array=0-2",
        "--gpus-per-node=8",
        "--ntasks-per-node=1",
        "--nodes=1",
        "--exclusive",
        "--signal=USR2@300",
        "--time=1440",
        "--partition=gpu",
        "--job-name=hsdump-kimi-k2.5",
        "--cpus-per-task=64",
    ):
        assert f"#SBATCH {line}" in script, (line, script)
    assert "-m submitit.core._submit" in script


def test_slurm_multinode_preset_runs_each_engine_on_two_nodes(tmp_path):
    c = config("+dist=slurm_multinode", "dist.num_jobs=4", "model=kimi_k25", "engine=gpu")
    assert c.dist.nodes_per_engine == 2 and c.hydra.launcher.nodes == 2
    assert c.hydra.launcher.tasks_per_node == 1
    assert c.hydra.sweeper.params["dist.job_index"] == "range(4)"
    env, rec = sbatch_stand_in(tmp_path)
    rc, log = harness.extract(
        MULTIRUN,
        "+dist=slurm_multinode",
        "dist.num_jobs=4",
        "model=kimi_k25",
        "engine=gpu",
        "model.tp_size=16",
        f"hydra.sweep.dir={tmp_path}/sweep",
        env=env,
        timeout=300,
    )
    assert rc != 0 and "test stand-in" in log, log[-3000:]
    script = (rec / "script.sh").read_text()
    for line in (
        "--array=0-3",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--exclusive",
    ):
        assert f"#SBATCH {line}" in script, (line, script)
    # submitit starts one task per node with the same command: each finds its rank in SLURM
    assert "srun" in script and "-m submitit.core._submit" in script


# ----------------------------------------------------------------------------- real jobs
def test_two_local_jobs_write_one_dataset_one_killed_and_rerun_alone(tmp_path, tiny_llama):
    ref, out = tmp_path / "ref", tmp_path / "out"
    # Two jobs through submitit's local executor, both writing `out`. Job 0 is SIGKILLed when
    # its 2nd shard is on disk but not yet in its commit log: HSDUMP_FAULT is before_record@02
    # for hydra job 0 and before_record@12 for job 1, which commits fewer than 12 shards.
    sweep = tmp_path / "sweep1"
    rc, log = harness.extract(
        MULTIRUN,
        "hydra/launcher=local_jobs",
        "dist.num_jobs=2",
        "dist.job_index=range(2)",
        f"hydra.sweep.dir={sweep}",
        "+hydra.job.env_set.HSDUMP_FAULT=before_record@${hydra.job.num}2",
        out=out,
        args=[*JOB_ARGS, DRY],
    )
    jobs_log = job_logs(sweep)
    assert rc != 0, log[-3000:]  # the sweep reports the killed job
    assert "samples written:" in jobs_log, (log[-2000:], jobs_log[-3000:])  # job 1 finished
    samples = committed(out)
    by_job = {0: [], 1: []}
    for sid, shard in samples.items():
        job = int(
            re.match(r"shards/j000(\d)of0002/0000/j000\dof0002-\d{6}\.safetensors$", shard).group(1)
        )
        assert int(sid) % 2 == job  # each job wrote only its own samples
        by_job[job].append(int(sid))
    assert len(by_job[1]) >= 3
    job0_shards = sorted(s for s in shards(out) if s.startswith("shards/j0000of0002/"))
    assert job0_shards == ["shards/j0000of0002/0000/j0000of0002-000000.safetensors"]  # 1st only
    assert (out / "shards/j0000of0002/0000/j0000of0002-000001.safetensors").exists()  # unlisted
    assert len(HsdumpDataset(str(out), allow_dry=True)) == len(samples)  # readable meanwhile
    before = shard_mtimes(out)
    committed_0 = len(by_job[0])

    # the killed job, re-run alone through the same launcher: it resumes. Meanwhile the
    # reference: the same config as one job, into its own folder.
    reference = harness.extract(
        f"hydra.run.dir={tmp_path}/run", out=ref, args=[*JOB_ARGS, DRY], wait=False
    )
    sweep2 = tmp_path / "sweep2"
    try:
        rc, log = harness.extract(
            MULTIRUN,
            "hydra/launcher=local_jobs",
            "dist.num_jobs=2",
            "dist.job_index=0",
            f"hydra.sweep.dir={sweep2}",
            out=out,
            args=[*JOB_ARGS, DRY],
        )
        ref_log, _ = reference.communicate(timeout=600)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    jobs_log = job_logs(sweep2)
    assert rc == 0, (log[-2000:], jobs_log[-3000:])
    assert reference.returncode == 0, ref_log[-3000:]
    assert f"already committed before this run: {committed_0}" in jobs_log, jobs_log[-3000:]
    assert shard_mtimes(out, before) == before  # nothing committed was rewritten

    # one dataset, every sample exactly once, equal to the single-job run
    listed = sum(len(s["ids"]) for s in shards(out).values())
    assert listed == len(committed(out))  # no sample in two listed shards
    assert all(
        re.match(r"shards/j000[01]of0002/0000/j000[01]of0002-\d{6}\.safetensors$", s)
        for s in shards(out)
    )
    da, db = HsdumpDataset(str(out), allow_dry=True), HsdumpDataset(str(ref), allow_dry=True)
    assert da.ids == db.ids and len(da) >= 8
    assert da.layers == db.layers == [2, 4, 5]
    for sid in da.ids:
        ra, rb = da.get(sid), db.get(sid)
        assert torch.equal(ra["input_ids"], rb["input_ids"])
        assert torch.equal(ra["loss_mask"], rb["loss_mask"])
        for x, y in zip(ra["hidden_states"], rb["hidden_states"]):
            assert torch.equal(x, y), sid  # the dry engine's rows: a function of the ids
    assert skipped(out) == skipped(ref)
    from hsdump.tools.verify import verify

    report = verify(str(out))
    assert not report.problems, [p.line() for p in report.problems]
    assert report.samples_ok == len(da)


# SGLang decides this: its data parallelism (dp_size=2: two scheduler processes, one replica
# each) routes the requests; every sample must come back once, from one replica, correct.
@pytest.mark.engine
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two replicas need two cores")
def test_sglang_data_parallel_replicas_write_each_sample_once(tmp_path, tiny_llama):
    out, ref = tmp_path / "out", tmp_path / "ref"
    # one engine, two replicas; on the CPU each replica gets its core through
    # SGLANG_CPU_OMP_THREADS_BIND. The reference for ids, tokens and skips: the same config on
    # the dry engine (they are hsdump's, not the engine's); for the rows: transformers.
    reference = harness.extract(
        f"hydra.run.dir={tmp_path}/run_ref", out=ref, args=[*JOB_ARGS, DRY], wait=False
    )
    try:
        rc, log = harness.extract(
            "+engine.extra.dp_size=2",
            f"hydra.run.dir={tmp_path}/run",
            out=out,
            args=JOB_ARGS,
            env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"},
        )
        ref_log, _ = reference.communicate(timeout=600)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    assert rc == 0, log[-3000:]
    assert reference.returncode == 0, ref_log[-3000:]
    # rows came from both replicas' scheduler processes (hsdump.capture.rows logs each sender)
    assert "captured rows came from 2 scheduler process(es)" in log, log[-3000:]

    listed = sum(len(s["ids"]) for s in shards(out).values())
    assert listed == len(committed(out))  # no sample in two listed shards
    da, db = HsdumpDataset(str(out)), HsdumpDataset(str(ref), allow_dry=True)
    assert da.ids == db.ids and len(da) >= 8
    assert da.layers == db.layers == [2, 4, 5]
    assert skipped(out) == skipped(ref)
    for sid in da.ids:
        ra, rb = da.get(sid), db.get(sid)
        assert torch.equal(ra["input_ids"], rb["input_ids"])
        assert torch.equal(ra["loss_mask"], rb["loss_mask"])
        ids = ra["input_ids"].tolist()
        hf = hf_hidden_states(tiny_llama, ids)
        hf16 = hf_hidden_states(tiny_llama, ids, torch.bfloat16)
        for h, k in zip(ra["hidden_states"], da.layers):
            assert per_sample_ok(rel_err(h, hf[k]), rel_err(hf16[k], hf[k])), (sid, k)
