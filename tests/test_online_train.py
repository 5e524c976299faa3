"""SpecForge 0.2.0's own DFlash trainer through an hsdump online folder (issue 52), on the CPU:
`bench/online_bench.py` (run as a script: tests import nothing of bench/) captures a few
samples of the tiny Llama's shapes (dry engine), exports them with `hsdump export --to
specforge --kind dflash` and trains SpecForge's offline trainer on the export; then the capture
runs again with `online=specforge` and a disk cap of twice hsdump's floor, beside
`python -m hsdump.online.consumer` (SpecForge's own online consumer: its RefDistributor, SQLite
ledger, acknowledgements per optimizer step, hsdump's store) on two ranks under torchrun (gloo,
online.dp_size=2; the offline trainer on two ranks too), which is SIGKILLed (torchrun and its
workers) after its second acknowledged and checkpointed step and restarted with
training.resume_from, while the capture is SIGKILLed once it has published 3 samples (or more:
it is polled) and started again with the same command.
"""

import json
import os
import subprocess
import sys

import pytest
from factories import ROOT
from test_export import _peer_root


# the slow tier, as SpecForge's other trainer runs (tests/test_acceptance_train.py)
@pytest.mark.engine
def test_dflash_through_the_folder_on_two_ranks_trains_as_offline_across_both_kills(tmp_path):
    sf, ac = _peer_root("HSDUMP_SPECFORGE_SRC"), _peer_root("HSDUMP_ACCELERATE_SRC")
    env = dict(os.environ, HSDUMP_SPECFORGE_SRC=sf, HSDUMP_ACCELERATE_SRC=ac)
    env.pop("HSDUMP_FORBID_ENGINE", None)  # no SGLang here: SpecForge's trainer, the dry engine
    out = tmp_path / "online.json"
    p = subprocess.run(
        [sys.executable, "bench/online_bench.py", "--out", out, "--work", tmp_path / "w",
         "--samples", "4", "--epochs", "2", "--batch", "1", "--ranks", "2", "--max-len", "256",
         "--anchors", "8", "--pace", "0", "--runs", "capped", "--kill-trainer-at", "2",
         "--kill-capture-at", "3"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    r = json.loads(out.read_text())
    # both trainers in float32 (the CPU's: bf16 matmuls without native bf16 are 40x slower):
    # hsdump's store hands the online one its bf16 rows cast, the offline one reads cast copies
    for run_dir in ("offline", "capped"):
        cfg = json.loads((tmp_path / "w" / run_dir / "train" / "run.json").read_text())
        assert cfg["model"]["torch_dtype"] == "float32", (run_dir, cfg["model"])
    run = r["runs"]["capped"]
    assert r["consumer"] == "specforge" and r["epochs"] == 2
    # the trainer saw the offline run's batches: SpecForge's losses equal, step by step,
    # across its kill and resume
    assert run["trainer_killed"] == {"at_step": 2, "resumed_from": "dflash-step2"}
    assert r["loss_equal_to_offline"] and len(r["offline"]["losses"]) == 4
    assert [s for s, _ in run["losses"]] == list(range(1, 5))
    # disk under the cap throughout (sampled every 5 ms), every sample acknowledged once
    # (its ledger's acked table), nothing left
    assert 0 < run["peak_bytes"] <= run["cap_bytes"]
    # more passed through the folder than the cap holds: its commit logs' shards, over the run
    assert run["bytes_published"] > run["cap_bytes"], (run["bytes_published"], run["cap_bytes"])
    # the trainer waited for its first sample at least (SpecForge's perf/data_wait_time_s)
    assert run["trainer_data_wait_s"] > 0, run["trainer_data_wait_s"]
    assert run["samples_published"] == run["samples_consumed"] == 8
    assert run["store_left_bytes"] == 0 and run["dropped_at_end"] == 0
    # the capture SIGKILLed before its end and started again with the same command:
    # nothing published twice, lost or trained twice
    killed = run["capture_killed"]
    assert 3 <= killed["at_published"] < 8 and killed["published_after"] == 8, killed
    assert (run["published_twice"], run["samples_lost"], run["steps_trained_twice"]) == (0, 0, 0)
    # both ranks acknowledged their samples into one file, each id once
    assert r["settings"]["ranks"] == 2
    acks = (tmp_path / "w" / "capped" / "folder" / "store" / "acks.jsonl").read_text().split()
    assert len(acks) == len(set(acks)) == 8, acks
