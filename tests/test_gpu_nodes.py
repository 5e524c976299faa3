"""One engine over two nodes, simulated on one host with two GPUs (bench/gpu_nodes.py, run as
that script): the two-node dataset against a one-process TP 1 run, rows from the DP group on
node 1, node 1 killed (node 0 stops naming it; resume completes), node 0 killed (node 1 leaves
by itself).

Run on the 2-GPU machine: python3 -m pytest -q -s tests/test_gpu_nodes.py
"""

import subprocess
import sys

import pytest
import torch
from factories import ROOT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 NVIDIA GPUs (CUDA)"),
]


def test_two_node_engine(tmp_path):
    out = tmp_path / "nodes.json"
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_nodes.py"),
            "--workdir",
            str(tmp_path),
            "--out",
            str(out),
        ],
        cwd=ROOT,
    )
    assert p.returncode == 0, out.read_text() if out.exists() else "no results"
