"""An engine over several nodes, the parts that run without GPUs: which node this process is
(hsdump.pipeline.node_layout), the SLURM launcher preset down to sbatch, the heartbeats node 0
watches (real Receiver and Sender over CURVE TCP on the loopback). The engine itself over two
nodes needs two GPUs: tests/test_gpu_nodes.py."""

import time
from types import SimpleNamespace

import pytest

from hsdump.config import DistConfig, EngineConfig
from hsdump.pipeline import node_layout

SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_NNODES": "2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NUM_TASKS": "2",
}


def cfg(**kw):
    """The two groups node_layout reads."""
    dist = DistConfig(**kw.pop("dist", {}))
    return SimpleNamespace(engine=EngineConfig(**kw), dist=dist)


def test_one_node_unless_asked_even_inside_a_multi_node_allocation(monkeypatch):
    # +dist=slurm_nodes style: one engine per node of a 2-node step stays one node per engine
    for k, v in SLURM.items():
        monkeypatch.setenv(k, v)
    lay = node_layout(cfg())
    assert (lay.nnodes, lay.node_rank, lay.multi) == (1, 0, False)


def test_slurm_step_gives_rank_and_node0_address(monkeypatch):
    for k, v in SLURM.items():
        monkeypatch.setenv(k, v)
    lay = node_layout(cfg(dist={"nodes_per_engine": 2}))
    assert (lay.nnodes, lay.node_rank, lay.origin) == (2, 1, "slurm")
    assert lay.dist_init_addr.startswith("gpu07:")
    with pytest.raises(ValueError, match="nodes_per_engine=4.*spans 2 node"):
        node_layout(cfg(dist={"nodes_per_engine": 4}))


def test_explicit_nodes_without_slurm():
    lay = node_layout(cfg(nnodes=2, node_rank=0, dist_init_addr="127.0.0.1:29500"))
    assert lay.multi and lay.is_head
    with pytest.raises(ValueError, match="needs dist_init_addr"):
        node_layout(cfg(nnodes=2, node_rank=1))
    with pytest.raises(ValueError, match="engine.nnodes instead"):
        EngineConfig(extra={"nnodes": 2})


def test_node0_names_the_node_whose_heartbeats_stop():
    from hsdump.capture.engine import CaptureEngine
    from hsdump.capture.nodes import NodeLayout
    from hsdump.capture.rows import Receiver, Sender, new_run_keys

    rx = Receiver("tcp://127.0.0.1:0", keys=new_run_keys())
    rx.start()
    try:
        node0 = CaptureEngine.__new__(CaptureEngine)  # only the watchdog's inputs
        node0.layout = NodeLayout(3, 0, "127.0.0.1:1", "explicit")
        node0.cfg = EngineConfig(node_timeout=1.5)
        node0._rx, node0._ready_at = rx, time.monotonic()
        beats = {n: Sender.from_spec(rx.sender_spec(), f"node{n}", send_timeout=5) for n in (1, 2)}
        for _ in range(4):
            for n, s in beats.items():
                s.heartbeat(n)
            time.sleep(0.5)
            assert node0._silent_node() is None
        deadline = time.monotonic() + 5
        msg = None
        while msg is None and time.monotonic() < deadline:
            beats[1].heartbeat(1)  # node 2 stopped
            time.sleep(0.3)
            msg = node0._silent_node()
        assert msg and msg.startswith("node 2 (host ") and "engine.node_timeout=1.5" in msg
        for s in beats.values():
            s.close(linger_s=0)
    finally:
        rx.stop()
