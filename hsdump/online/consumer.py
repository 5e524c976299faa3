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
import json
import os
import sys
import threading
from pathlib import Path
from typing import List, Optional

from hsdump.online import folder as F
from hsdump.online.vocab import NoCounts

KEEP_CHECKPOINTS = 2
"""training.max_checkpoints when run.yaml leaves it unset: the newest two (and SpecForge's best
one) are kept, the older deleted as each is written."""


DEFAULT_HEAD_KEY = "lm_head.weight"  # SpecForge 0.2.0's model.lm_head_key
TIED_HEAD_KEY = "model.embed_tokens.weight"
"""model.lm_head_key when run.yaml leaves SpecForge's default and the target ties its LM head to
its embedding: the weight SpecForge's trainer then loads as the target's head."""


def tied_head(model: dict) -> bool:
    """Whether the target (model.target_model_path, a local folder) ties its LM head to its
    embedding (config.json's tie_word_embeddings, or its text_config's); False where it cannot
    be read (a hub id: SpecForge's own default stands)."""
    cfg = Path(str(model.get("target_model_path") or "")) / "config.json"
    try:
        c = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False
    return bool(
        c.get("tie_word_embeddings", (c.get("text_config") or {}).get("tie_word_embeddings"))
    )


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
    if "max_checkpoints" not in cfg.training.model_fields_set:
        # resuming needs the checkpoint of the last acknowledged step (save_interval: 1 makes
        # every step one); SpecForge keeps every checkpoint unless told: a drafter's each step
        tr["max_checkpoints"] = KEEP_CHECKPOINTS
    if raw["model"].get("lm_head_key") == DEFAULT_HEAD_KEY and tied_head(raw["model"]):
        # SpecForge loads the target's LM head by this key, which a target that ties it to its
        # embedding (SmolLM2) does not have in its files (the embedding is the same weight)
        raw["model"]["lm_head_key"] = TIED_HEAD_KEY
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
    rank0 = os.environ.get("RANK", "0") == "0"
    if rank0 and F.side(folder, F.CONSUMER_FAILED) is not None:  # an earlier attempt's
        Path(str(F.refs_path(folder)) + F.CONSUMER_FAILED).unlink()
    # any death of the trainer, refusals included: the capture stops at its next request
    # (not waiting out online.peer_timeout_s) and says why; both commands resume
    died = "the trainer (python -m hsdump.online.consumer) died: "
    try:
        return train(folder, a, rank0)
    except SystemExit as e:
        if e.code not in (None, 0):
            failed(folder, f"{died}exit {e.code}")
        raise
    except BaseException as e:
        failed(folder, f"{died}{type(e).__name__}: {e}")
        raise


class Refused(Exception):
    """Bad input or a missing dependency, found before the trainer starts (exit 2)."""


def failed(folder: Path, why: str) -> None:
    """SpecForge's consumer-failure file, written whole (any rank: the first one to die)."""
    rank = os.environ.get("RANK", "0")
    F.write_side(folder, F.CONSUMER_FAILED, why if rank == "0" else f"rank {rank}: {why}")


# what SpecForge 0.2.0's worker path imports (specforge.cli._train: accelerate.utils.set_seed)
NEEDED = ("specforge.application", "specforge.cli", "specforge.config", "accelerate.utils")
INSTALL = (
    "pip install --no-deps --target .specforge specforge==0.2.0 accelerate==1.15.0, then "
    "PYTHONPATH=$PWD/.specforge (docs/online.md: SpecForge's own pins clash with SGLang's)"
)


def check_imports(needed=NEEDED) -> None:
    """Every module the trainer imports, before anything starts: a Refused naming the
    missing one and the install line."""
    import importlib

    for name in needed:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise Refused(
                f"{name} cannot be imported here ({e}); the trainer needs SpecForge 0.2.0 and "
                f"accelerate 1.15.0 beside hsdump: {INSTALL}"
            ) from None


def check_draft_ids(draft_config: Optional[str], plan: dict) -> None:
    """The drafter config's layer ids (where SGLang reads them) must be the capture's serving
    ids (online.json): a Refused naming both and the fix. Not checked when either is unknown."""
    import json

    from hsdump.tools.export import CONFIG_KEY

    want, key = plan.get("serving_ids"), CONFIG_KEY.get(plan["kind"])
    if want is None or key is None or not draft_config or not Path(draft_config).is_file():
        return
    got = json.loads(Path(draft_config).read_text())
    for part in key.split("."):
        got = got.get(part) if isinstance(got, dict) else None
    if got is not None and list(got) != list(want):
        raise Refused(
            f"model.draft_model_config={draft_config} has {key}={list(got)}, but the capture "
            f"serves layers {list(want)} (serving_ids in its online.json): put {list(want)} "
            "there, so the drafter trains and serves on the layers it is fed"
        )


def with_vocab_map(cfg, folder: Path, plan: dict):
    """`cfg` with model.vocab_mapping_path set for an EAGLE-3 capture when run.yaml names
    none and the drafter's vocabulary is smaller than the target's: SpecForge's own map of the
    capture's counts (hsdump.online.vocab), the one its offline trainer would derive from an
    export of the same samples. Raises NoCounts, naming the fix."""
    from hsdump.online.vocab import sizes, specforge_map

    if plan.get("kind") != "eagle3" or cfg.model.vocab_mapping_path:
        return cfg
    draft, target = sizes(cfg)
    if draft == target:
        return cfg
    path = specforge_map(folder, cfg.data.cache_dir, draft, target, cfg.data.max_length)
    print(f"hsdump: EAGLE-3's vocabulary map from the capture's counts: {path}", file=sys.stderr)
    raw = cfg.model_dump()
    raw["model"]["vocab_mapping_path"] = path
    return type(cfg).model_validate(raw)


def train(folder: Path, a, rank0: bool) -> int:
    import json

    try:
        check_imports()
    except Refused as e:
        print(e, file=sys.stderr)
        failed(folder, f"the trainer was refused: {e}")
        return 2
    from specforge.application import bind_run, resolve_run
    from specforge.cli import _train, _worker_signal_unwind, _WorkerTermination
    from specforge.config import load_config

    plan = json.loads((folder / F.PLAN).read_text())
    user = load_config(a.config, a.overrides)
    cfg = consumer_config(user, folder, plan)
    if cfg.training.strategy != plan["kind"]:
        why = (
            f"training.strategy={cfg.training.strategy} but the capture feeds {plan['kind']} "
            f"({folder / F.PLAN}): train {plan['kind']}, or capture for "
            f"{cfg.training.strategy}"
        )
        print(why, file=sys.stderr)
        failed(folder, f"the trainer was refused: {why}")
        return 2
    try:
        check_draft_ids(cfg.model.draft_model_config, plan)
    except Refused as e:
        print(e, file=sys.stderr)
        failed(folder, f"the trainer was refused: {e}")
        return 2
    try:
        cfg = with_vocab_map(cfg, folder, plan)
    except NoCounts as e:
        print(e, file=sys.stderr)
        failed(folder, f"the trainer was refused: {e}")
        return 2
    os.environ.update(environment(folder))
    patch_store(folder, cfg.data.max_length, cfg.model.torch_dtype)
    stop = threading.Event()
    if rank0:
        F.beat(folder / F.CONSUMER_ALIVE)
        threading.Thread(
            target=heartbeats, args=(folder, a.producer_timeout, stop), daemon=True
        ).start()
    resolved = resolve_run(cfg)
    try:
        with _worker_signal_unwind():
            _train(bind_run(resolved.config, resolved.algorithm))  # its value: not a status
    except _WorkerTermination as received:
        failed(folder, f"the trainer was stopped by signal {received.signum}")
        return 128 + received.signum
    finally:
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
