"""One engine over two nodes, simulated on one host with two GPUs, through extract.py.

Two processes, one GPU each (CUDA_VISIBLE_DEVICES), run the same command with
`engine.nnodes=2 engine.node_rank=0|1 engine.dist_init_addr=127.0.0.1:PORT` and the TP 2 + DP
attention layout (tests/gpu.py's tp2-dpattn): DP group 1's attention-TP rank 0 is on "node 1",
so its rows reach node 0 over TCP (CURVE keys from the output folder). On the layouts'
DeepSeek-V3 model:
1. the two-node dataset equals the one-process TP 1 dataset within NODES_VS_TP1_MAX
   (hsdump.check), verify is clean, and rows came from both DP groups, one of them on node 1;
2. node 1 killed after the engine started: node 0 exits non-zero naming node 1, and the same
   two commands again complete the dataset, which verifies;
3. node 0 killed: node 1 exits by itself within engine.node_timeout + 60 s.

Run on a 2-GPU machine: python3 -m pytest -q -s tests/test_gpu_nodes.py
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from factories import ROOT
from gpu import (
    COMMON,
    LAYOUT_LAYERS,
    layout_model,
    layout_overrides,
    offline_env,
    records,
    row_sources,
    run_extract,
    save,
    verify,
)
from harness import clean_env

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 NVIDIA GPUs (CUDA)"),
]

NODE_TIMEOUT = 20
# each test runs two-node engines (up to 420 s each) and the first also the TP 1 reference
pytestmark.append(pytest.mark.timeout(1800))


def start(model, out, rank: int, port: int, work: Path, tag: str):
    """Node `rank` of the two-node engine, in a session of its own; (process, its log)."""
    cmd = [
        sys.executable,
        str(ROOT / "extract.py"),
        f"model.path={model}",
        "model.name=dsv3-small",
        f"output.dir={out}",
        "progress=false",
        *COMMON,
        *layout_overrides("tp2-dpattn"),
        "engine.nnodes=2",
        f"engine.node_rank={rank}",
        f"engine.dist_init_addr=127.0.0.1:{port}",
        f"engine.node_timeout={NODE_TIMEOUT}",
    ]
    env = clean_env({**offline_env(), "CUDA_VISIBLE_DEVICES": str(rank), "PYTHONUNBUFFERED": "1"})
    log = work / f"{tag}-node{rank}.log"
    with open(log, "w") as f:
        p = subprocess.Popen(
            cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return p, log


def wait(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # SGLang's processes too
        proc.wait()
        return "timeout"


def wait_for(log: Path, text: str, timeout: float) -> bool:
    t = time.time()
    while time.time() - t < timeout:
        if text in log.read_text(errors="replace"):
            return True
        time.sleep(1)
    return False


def two_nodes(model, out, port, work, tag, timeout=420):
    (p0, log0), (p1, log1) = (start(model, out, r, port, work, tag) for r in (0, 1))
    rc0, rc1 = wait(p0, timeout), wait(p1, 120)
    return rc0, rc1, log0.read_text(errors="replace"), log1.read_text(errors="replace")


def kill_one(model, out, port, work, tag, victim: int):
    """Both nodes started; `victim` SIGKILLed (its process group) 3 s after node 1's
    schedulers run. (the survivor, its log, whether the engine came up)."""
    procs = [start(model, out, r, port, work, tag) for r in (0, 1)]
    up = wait_for(procs[1][1], "SGLang processes running", 400)
    time.sleep(3)
    os.killpg(procs[victim][0].pid, signal.SIGKILL)
    wait(procs[victim][0], 30)
    return procs[1 - victim][0], procs[1 - victim][1], up


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    work = tmp_path_factory.mktemp("nodes")
    model = layout_model("dsv3", work)
    out = work / "ds-tp1"
    rc = run_extract(
        f"model.path={model}",
        "model.name=dsv3-small",
        *COMMON,
        *layout_overrides("tp1"),
        out=out,
        log=work / "extract-tp1.log",
    )
    assert rc == 0, (work / "extract-tp1.log").read_text()[-3000:]
    return {"work": work, "model": model, "tp1": records(out), "report": {}}


def test_two_node_rows_equal_one_process_tp1(setup):
    from hsdump import check

    work, model, base = setup["work"], setup["model"], setup["tp1"]
    out = work / "ds-2nodes"
    rc0, rc1, log0, log1 = two_nodes(model, out, 29700, work, "run")
    assert rc0 == 0 and rc1 == 0, log0[-2500:] + "\n" + log1[-1500:]
    vrc, vtail = verify(out)
    recs = records(out)
    assert vrc == 0, vtail
    assert [r["id"] for r in recs] == [b["id"] for b in base]
    worst = {
        str(k): max(
            check.rel_err(a["hidden_states"][j], b["hidden_states"][j]) for a, b in zip(recs, base)
        )
        for j, k in enumerate(LAYOUT_LAYERS)
    }
    n, sources = row_sources(log0)
    save("gpu-nodes", {"worst_vs_tp1": worst, "row_sources": sources})
    assert max(worst.values()) < check.NODES_VS_TP1_MAX, worst
    assert "node1" in sources, sources


def test_node1_killed_node0_names_it_and_a_rerun_completes(setup):
    work, model = setup["work"], setup["model"]
    out = work / "ds-kill1"
    p0, log0, up = kill_one(model, out, 29800, work, "kill1", victim=1)
    rc0 = wait(p0, NODE_TIMEOUT + 180)
    text0 = log0.read_text(errors="replace")
    assert up and rc0 not in (0, "timeout"), text0[-2000:]
    assert "node 1" in text0, text0[-2000:]
    rc0, rc1, again0, _ = two_nodes(model, out, 29900, work, "resume")
    assert rc0 == 0, again0[-2500:]
    vrc, vtail = verify(out)
    assert vrc == 0, vtail


def test_node0_killed_node1_leaves_by_itself(setup):
    work, model = setup["work"], setup["model"]
    p1, log1, up = kill_one(model, work / "ds-kill0", 30100, work, "kill0", victim=0)
    rc1 = wait(p1, NODE_TIMEOUT + 60)
    assert up and rc1 not in (0, "timeout"), log1.read_text(errors="replace")[-2000:]
