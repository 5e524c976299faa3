"""`python -m hsdump.online.consumer FOLDER -c run.yaml [overrides...]`: SpecForge 0.2.0's own
online consumer (its RefDistributor, SQLite ledger, Trainer, acks per optimizer step) on an
hsdump online folder. Under torchrun for several GPUs:

    torchrun --nproc_per_node 8 -m hsdump.online.consumer FOLDER -c run.yaml \\
        deployment.trainer.nproc_per_node=8

`run.yaml` is the SpecForge run config of an offline run (model, training, data.max_length;
its data source is replaced): this command makes it the online consumer's (data source and
deployment on FOLDER, training.role=consumer, training.num_epochs and prompt_seed the
producer's), sets SpecForge's DISAGG_* variables to FOLDER's files and runs SpecForge's worker
path as `specforge train` does (`specforge.cli._train`).

The patch, and all of it: SpecForge 0.2.0 builds the online consumer's FeatureStore with
`specforge.training.disaggregated._mooncake_store`, and its config checks refuse any backend
but Mooncake online (config/schema.py, application/planning.py, launch_plan.py). Here that one
function returns hsdump's store (hsdump.online.store.HsdumpFeatureStore) and the config says
`backend: mooncake` to pass the checks; no Mooncake client, master or endpoint is used
(launch_plan, which would ask for them, is not run: this process is the worker).

Heartbeats: FOLDER/control/consumer.alive beats every second (the producer stops when it goes
quiet for online.peer_timeout_s); when the producer's goes quiet for --producer-timeout s
before the stream is closed, this writes SpecForge's producer-failure file (refs.jsonl.failed),
so its consumer stops as SpecForge's own does on a producer failure. Resume a stopped trainer
with training.resume_from=<its last checkpoint> (SpecForge resumes only from the checkpoint of
its last acknowledged step: training.save_interval=1 makes every step one).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import List, Optional

from hsdump.online import folder as F


def consumer_config(cfg, folder: Path, plan: dict):
    """SpecForge config `cfg` as the online consumer's on `folder` (a new Config)."""
    from specforge.config import Config

    raw = cfg.model_dump()
    data = raw["data"]
    data.update(train_data_path="", hidden_states_path="", eval_hidden_states_path="")
    data["prompts_path"] = str(folder / F.PLAN)  # online mode's source; the consumer reads none
    tr = raw["training"]
    tr.update(role="consumer", num_epochs=int(plan["epochs"]), prompt_seed=int(plan["seed"]))
    tr["eval_interval"] = 0  # SpecForge evaluates offline data only
    raw["model"]["target_backend"] = "sglang"
    raw["deployment"] = dict(
        mode="disaggregated",
        trainer=raw["deployment"]["trainer"],
        disaggregated=dict(control_dir=str(folder / "control"), backend="mooncake"),
    )
    return Config.model_validate(raw)


def patch_store(folder: Path, max_length: int, dtype: Optional[str] = None) -> None:
    """SpecForge's online FeatureStore factory -> hsdump's store on `folder`, handing the
    trainer its float tensors in `dtype` (its model.torch_dtype)."""
    import specforge.training.disaggregated as disagg

    from hsdump.online.store import HsdumpFeatureStore

    def store(cfg, *, retain_on_release: bool = False):
        return HsdumpFeatureStore(
            folder, retain_on_release=retain_on_release, max_length=max_length, dtype=dtype
        )

    disagg._mooncake_store = store


def environment(folder: Path) -> dict:
    """SpecForge's DISAGG_* variables for `folder` (launch_plan's names)."""
    return {
        "DISAGG_BACKEND": "mooncake",
        "DISAGG_STORE_ID": F.RUN_ID,
        "DISAGG_REF_CHANNEL": str(folder / F.REFS),
        "DISAGG_DB": str(folder / F.DB),
        "DISAGG_INBOX_DIR": str(folder / F.INBOXES),
    }


def heartbeats(folder: Path, producer_timeout: float, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        F.beat(folder / F.CONSUMER_ALIVE)
        quiet = F.silent_for(folder / F.PRODUCER_ALIVE)
        closed = F.side(folder, F.CLOSED) is not None or F.side(folder, F.FAILED) is not None
        if not closed and quiet is not None and producer_timeout and quiet > producer_timeout:
            F.write_side(
                folder,
                F.FAILED,
                f"hsdump producer silent for {quiet:.0f} s (--producer-timeout "
                f"{producer_timeout:g}): restart it, then this trainer with "
                "training.resume_from=<its last checkpoint>",
            )


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hsdump.online.consumer",
        description="SpecForge 0.2.0's online consumer on an hsdump online folder",
    )
    ap.add_argument("folder", help="the producer's online.folder")
    ap.add_argument("-c", "--config", required=True, help="SpecForge run config (YAML or JSON)")
    ap.add_argument("--producer-timeout", type=float, default=300.0,
                    help="stop when the producer has been silent this long (s; 0: never)")  # fmt: skip
    ap.add_argument("overrides", nargs="*", help="SpecForge's dotted overrides")
    a = ap.parse_intermixed_args(argv)  # FOLDER -c run.yaml key=value ...
    folder = Path(a.folder).resolve()
    plan_path = folder / F.PLAN
    if not plan_path.exists():
        print(
            f"{plan_path} is missing: start the capture first (python extract.py "
            f"online=specforge online.folder={a.folder} ...); it writes the plan once the "
            "dataset is tokenized",
            file=sys.stderr,
        )
        return 2
    import json

    try:
        from specforge.application import bind_run, resolve_run
        from specforge.cli import _train, _worker_signal_unwind, _WorkerTermination
        from specforge.config import load_config
    except ImportError as e:
        print(
            f"SpecForge 0.2.0 cannot be imported here ({e}): run this in the trainer's "
            "environment (pip install specforge==0.2.0, and hsdump with --no-deps)",
            file=sys.stderr,
        )
        return 2

    plan = json.loads(plan_path.read_text())
    cfg = consumer_config(load_config(a.config, a.overrides), folder, plan)
    if cfg.training.strategy != plan["kind"]:
        print(
            f"training.strategy={cfg.training.strategy} but the capture feeds {plan['kind']} "
            f"({plan_path}): train {plan['kind']}, or capture for {cfg.training.strategy}",
            file=sys.stderr,
        )
        return 2
    os.environ.update(environment(folder))
    patch_store(folder, cfg.data.max_length, cfg.model.torch_dtype)
    stop = threading.Event()
    if os.environ.get("RANK", "0") == "0":
        F.beat(folder / F.CONSUMER_ALIVE)
        threading.Thread(
            target=heartbeats, args=(folder, a.producer_timeout, stop), daemon=True
        ).start()
    resolved = resolve_run(cfg)
    try:
        with _worker_signal_unwind():
            _train(bind_run(resolved.config, resolved.algorithm))
    except _WorkerTermination as received:
        return 128 + received.signum
    finally:
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
