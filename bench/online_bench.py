"""Train while capturing, measured (issue 52): hsdump's capture feeds SpecForge 0.2.0's own
online DFlash trainer through one folder, with and without a disk cap, beside an offline run of
SpecForge's trainer on `hsdump export --to specforge --kind dflash` of the same samples.
`--kind eagle3` does the same for EAGLE-3: bf16, its loss in eager torch on the CPU (SpecForge's
is a Triton kernel: bench/acceptance/patches/cpu_eagle3_loss.py, in both trainers); the online
run names no vocabulary map (the consumer builds SpecForge's from the capture's counts), and
`vocab_map_equal_to_offline` says whether it is the one SpecForge derived in the offline run.

    python bench/online_bench.py --out bench/results/online-cpu.json     # CPU: results/online-cpu.json

One run, three trainings of the same DFlash drafter (SpecForge's trainer, CPU, gloo, batch
--batch, --epochs epochs, seed 0) on the same samples (the dry engine's rows of the tiny Llama's
shapes: the folder protocol is what is measured here, not SGLang):

1. offline: a capture into a dataset, `hsdump export --to specforge --kind dflash`, SpecForge's
   offline trainer (`specforge train`, data.hidden_states_path) on the export;
2. online, no cap: `python extract.py online=specforge online.folder=F ...` beside
   `python -m hsdump.online.consumer F -c run.json`;
3. online, capped: the same with online.cap_bytes=--cap (0: twice hsdump's floor for these
   samples and this trainer), its trainer SIGKILLed after step --kill-trainer-at (when that step
   is acknowledged and checkpointed) and resumed with training.resume_from (0: no kill), and
   with --kill-capture-at N the capture SIGKILLed once N samples are published and started
   again with the same command. Each run counts the samples published twice, lost (published
   but never acknowledged, less SpecForge's dropped tail) and the optimizer steps trained twice.

The capture is paced (engine.dry_tokens_per_s) below the trainer's pace, so the trainer keeps
up, and the capture throughput with and without the cap is compared at that pace. A thread
samples the bytes of every shard file (temporaries included) under F/store every 5 ms: the
peak is `peak_bytes`. Per-step losses are SpecForge's own log lines; `loss_equal_to_offline`
compares each online run's with the offline run's, step by step (exact equality).
`samples_consumed` counts SpecForge's ledger's optimizer-durable acknowledgements (its SQLite
`acked` table); SpecForge drops a tail shorter than one optimizer window (none when the samples
of all epochs fill whole windows).

`--engine gpu --data MESSAGES` is the same on a GPU, on a conversations file (`hsdump export
--to messages` of a regenerating capture: the online mode does not regenerate); its JSON gathers
the fields issue 73 asks (`gpu`, `bytes_published`, `waits`, `capture_tokens_per_s`: with the
trainer against the offline twin's capture alone, `kills`), and `bench/online_pair.py` adds the
two drafters' served accept lengths, paired. Not run through on a GPU yet: its one try (an
H100, docs/reports/2026-12-07-online-eagle3-gpu-first-try.md) stopped at the offline trainer's
start, on SmolLM2's tied LM head (run_config now names its key).

SpecForge 0.2.0 and accelerate 1.15.0 are not installable beside SGLang: pass their unpacked
wheels' roots (--specforge, --accelerate; default the test suite's cache,
~/.cache/hsdump/peers/specforge-0.2.0 and accelerate-1.15.0, which `make test` fills).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the repository first, and not bench/ (this script's folder), whose bench.py would shadow it
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

KIND = "dflash"  # --kind sets it
PATCH_LOSS = [False]  # EAGLE-3 off the GPU: its loss in eager torch (main sets it)
DATA = []  # --data: the dataset overrides of every capture (default: the model preset's)
EXTRA = []  # --capture-arg: more extract.py overrides of every capture (a GPU shared with the
# trainer: engine.mem_fraction_static, so SGLang leaves the trainer its memory)
# the online consumer with EAGLE-3's loss in eager torch: SpecForge's is a Triton kernel, and
# this bench runs on the CPU (bench/acceptance/patches/cpu_eagle3_loss.py; one process, so the
# patch applied here is the one its trainer runs)
CPU_CONSUMER = (
    "import sys; from bench.acceptance.patches import cpu_eagle3_loss; cpu_eagle3_loss.apply(); "
    "from hsdump.online.consumer import main; sys.exit(main(sys.argv[1:]))"
)
CACHE = Path(os.environ.get("HSDUMP_CACHE", Path.home() / ".cache" / "hsdump")) / "peers"
RANKS = [1]  # --ranks: the trainer's processes (torchrun), online.dp_size


def launcher() -> list:
    """How a trainer command starts: python, or torchrun with --ranks processes (each a
    worker; SpecForge's CLI recognizes torchrun's environment and does not launch again)."""
    n = RANKS[0]
    if n == 1:
        return [sys.executable]
    # rank 0's output alone in the log: every rank logs SpecForge's step lines
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
            "--local-ranks-filter=0"]  # fmt: skip


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it, as a crash of the machine would (torchrun
    starts its workers in sessions of their own: killing torchrun alone leaves them training)."""
    from bench.bench_monitor import _tree_pids

    for p in _tree_pids(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def ranks_override() -> list:
    return [f"deployment.trainer.nproc_per_node={RANKS[0]}"] if RANKS[0] > 1 else []


def dir_bytes(path: Path) -> int:
    """Bytes of the shard files (and their temporaries) under `path`."""
    from hsdump.online.folder import shard_bytes

    return shard_bytes(path)


class Sampler(threading.Thread):
    """The peak of dir_bytes(path), sampled every `every_s`."""

    def __init__(self, path: Path, every_s: float = 0.005):
        super().__init__(daemon=True)
        self.path, self.every_s, self.peak, self.samples = path, every_s, 0, 0
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            self.peak = max(self.peak, dir_bytes(self.path))
            self.samples += 1
            self.halt.wait(self.every_s)

    def stop(self) -> int:
        self.halt.set()
        self.join()
        self.peak = max(self.peak, dir_bytes(self.path))
        return self.peak


def peer_env(specforge: str, accelerate: str) -> dict:
    env = dict(os.environ)
    # the peers first, then what the caller had (the GPU host's SGLang site), then the repo
    had = [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x]
    env["PYTHONPATH"] = os.pathsep.join([specforge, accelerate, *had, str(ROOT)])
    env.pop("HSDUMP_FORBID_ENGINE", None)
    return env


def capture_args(
    samples: int, max_len: int, pace: float, engine: str = "dry", model: str = "tiny"
) -> list:
    """extract.py's arguments: `engine` dry (paced at `pace` tokens/s) or cpu (SGLang's real
    engine on the CPU), on the model preset `model`."""
    eng = (
        ["engine=dry", f"engine.dry_tokens_per_s={pace}"]
        if engine == "dry"
        else [f"engine={engine}"]
    )
    return [
        *eng,
        f"model={model}",
        *DATA,
        f"dataset.max_samples={samples}",
        f"dataset.max_seq_len={max_len}",
        f"capture.kinds=[{KIND}]",
        *(["capture.final=[post_norm]"] if KIND == "eagle3" else []),
        "progress=false",
        *EXTRA,
    ]


def draft_files(work: Path, target: str, export: Path, env) -> Path:
    """The DFlash drafter's config: `python3 -m bench.acceptance draft-config` (its recipe on
    the target, the export's serving ids, SpecForge's mask token)."""
    path = work / "draft.json"
    run([sys.executable, "-m", "bench.acceptance", "draft-config", "--kind", KIND,
         "--target", target, "--export", export, "--out", path], env)  # fmt: skip
    return path


def run_config(work: Path, target: str, draft: Path, data: str, a, kill_at: int = 0) -> Path:
    """SpecForge's run config (one process, CPU: NO_SHARD is DDP on gloo; sdpa attention); no
    vocabulary map named: SpecForge derives EAGLE-3's offline, the consumer online."""
    import bench.acceptance as ak

    cfg = dict(
        run_id=KIND,
        output_dir=str(work / "run"),
        model=dict(
            target_model_path=ak.trainer_target(target, work / "target"),
            draft_model_config=str(draft),
            torch_dtype=a.dtype,
        ),
        data=dict(
            hidden_states_path=data,
            max_length=a.max_len,
            dataloader_num_workers=0,
            cache_dir=str(work / "cache"),
        ),
        training=dict(
            strategy=KIND,
            num_epochs=a.epochs,
            batch_size=a.batch,
            attention_backend="sdpa",
            save_interval=1 if kill_at else a.save_interval,
            log_interval=1,
            seed=0,
            fsdp_sharding="NO_SHARD",
            **{
                **ak.TRAINING[KIND],
                **(
                    {"num_anchors": a.anchors} if KIND != "eagle3" else {"ttt_length": a.ttt_length}
                ),
            },
        ),
    )
    from hsdump.online.consumer import TIED_HEAD_KEY, tied_head

    if tied_head(cfg["model"]):  # SmolLM2: the target's LM head is its embedding, in both runs
        cfg["model"]["lm_head_key"] = TIED_HEAD_KEY
    path = work / "run.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def losses(log: Path) -> list:
    import bench.acceptance as ak

    return [[r["step"], r["loss"]] for r in ak.trainer_metrics(log) if "loss" in r]


def data_wait_s(logs: list) -> float:
    """Seconds the trainer waited for data over its logged steps (SpecForge's per-step mean
    `perf/data_wait_time_s` of each log window times the window's steps), across its lives."""
    import bench.acceptance as ak

    total = 0.0
    for log in logs:
        prev = None
        for r in ak.trainer_metrics(log):
            if "perf/data_wait_time_s" in r:
                steps = r["step"] - prev if prev is not None else 1
                total += float(r["perf/data_wait_time_s"]) * max(1, steps)
                prev = r["step"]
    return round(total, 3)


def loss_diff(a: list, b: list) -> float:
    """The largest |difference| of two runs' per-step losses (inf: other steps)."""
    if [s for s, _ in a] != [s for s, _ in b]:
        return float("inf")
    return max((abs(x - y) for (_, x), (_, y) in zip(a, b)), default=0.0)


def model_path(preset: str) -> str:
    """The model.path of conf/model/PRESET.yaml."""
    import yaml

    return yaml.safe_load((ROOT / "conf" / "model" / f"{preset}.yaml").read_text())["path"]


def engine_name(preset: str, engine: str = "cpu") -> str:
    from importlib.metadata import version

    where = "the CPU" if engine == "cpu" else gpu_name()
    return f"SGLang {version('sglang')} on {where} ({model_path(preset)})"


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


def acked(folder: Path) -> int:
    with sqlite3.connect(folder / "control" / "consumer.sqlite") as db:
        return db.execute("SELECT count(*) FROM acked").fetchone()[0]


def offline(work: Path, a, env) -> dict:
    """Capture, export, SpecForge's offline trainer: its losses and the drafter's ids."""
    ds, ex = work / "ds", work / "ex"
    args = capture_args(a.samples, a.max_len, 0, a.engine, a.model)
    t = time.time()  # the capture alone (no trainer beside it), its engine's start included
    run([sys.executable, "extract.py", *args, f"output.dir={ds}"], env)
    alone_s = time.time() - t
    tokens = sum(json.loads((ds / "index.json").read_text())["samples"]["length"])
    # SpecForge feeds its records to the drafter as stored: written in the trainer's dtype
    run([sys.executable, "-m", "hsdump", "export", ds, ex, "--to", "specforge", "--kind", KIND,
         "--dtype", a.dtype, "--no-progress", *(["--allow-dry"] if a.engine == "dry" else [])],
        env)  # fmt: skip
    from hsdump.tiny import resolve_model_path

    target = resolve_model_path(model_path(a.model))
    draft = draft_files(work, target, ex, env)
    cfg = run_config(work / "train", target, draft, str(ex), a)
    log = work / "train.log"
    t = time.time()
    cli = ["bench.acceptance.specforge_cli", "--cpu"] if PATCH_LOSS[0] else ["specforge.cli"]
    run([*launcher(), "-m", *cli, "train", "--config", cfg, *ranks_override()], env, log=log)
    maps = sorted((work / "train" / "cache" / "vocab_mapping").glob("*.pt"))
    return dict(losses=losses(log), train_s=round(time.time() - t, 2), target=target, draft=draft,
                records=len(list(ex.glob("rows_*/*.ckpt"))),
                capture_alone=dict(tokens=tokens, wall_s=round(alone_s, 2),
                                   tokens_per_s=round(tokens / alone_s, 1)),
                vocab_mapping=str(maps[0]) if maps else "")  # fmt: skip


def cap_for(ds: Path, a) -> int:
    """Twice the least cap hsdump takes for these samples and this trainer (hsdump.online's
    floor: one optimizer window and one sample more of dataset.max_seq_len tokens, and a
    shard), from the offline capture's manifest (the same model, layers and storage)."""
    from hsdump.online.producer import least_cap, sample_bytes

    m = json.loads((ds / "manifest.json").read_text())
    slots = len(m["layers"]) + len(m["final"])
    one = sample_bytes(a.max_len, m["model"]["hidden_size"], slots, m["storage_dtype"])
    return 2 * least_cap(a.batch * RANKS[0], one)


def durable_step(folder: Path):
    """The optimizer step SpecForge's ledger last made durable (None: none yet)."""
    try:
        with sqlite3.connect(folder / "control" / "consumer.sqlite", timeout=0.1) as db:
            row = db.execute("SELECT v FROM marker WHERE k='global_step'").fetchone()
        return int(row[0]) if row and row[0] not in (None, "None") else None
    except (sqlite3.Error, ValueError):
        return None


def bytes_published(folder: Path) -> int:
    """Bytes of every shard the capture committed to the folder's store over the run (its
    epochs' commit logs, which outlive the shards the trainer's acknowledgements delete): what
    passed through the cap."""
    from hsdump.online.folder import ShardBook

    book = ShardBook(folder)
    book.refresh()
    return sum(dict(book.shard_of.values()).values())


def published_ids(folder: Path) -> list:
    """The sample ids in the folder's refs, in their order (one per line published)."""
    refs = folder / "control" / "refs.jsonl"
    if not refs.exists():
        return []
    return [json.loads(x)["sample_id"] for x in refs.read_text().splitlines() if x.strip()]


def online(work: Path, a, env, off: dict, cap: int, kill_at: int = 0,
           kill_capture_at: int = 0) -> dict:  # fmt: skip
    """Producer and SpecForge's consumer side by side on one folder; `kill_at`: SIGKILL the
    trainer once it has acknowledged step `kill_at` and checkpointed it, and restart it with
    training.resume_from=that checkpoint; `kill_capture_at`: SIGKILL the capture once it has
    published that many samples, and start it again with the same command."""
    folder = work / "folder"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # no vocabulary map named: the consumer builds EAGLE-3's from the capture's counts
    cfg = run_config(work / "train", off["target"], off["draft"], "unused", a, kill_at)
    sampler = Sampler(folder / "store")
    sampler.start()
    prod = [sys.executable, "extract.py", *capture_args(a.samples, a.max_len, a.pace, a.engine, a.model),
            "online=specforge", f"online.folder={folder}", f"online.cap_bytes={cap}",
            f"online.kind={KIND}", f"online.epochs={a.epochs}", f"online.batch_size={a.batch}",
            f"online.dp_size={RANKS[0]}",
            "online.peer_timeout_s=120"]  # fmt: skip
    t = time.time()
    plog = work / "producer.log"
    p = run(prod, env, log=plog, wait=False)
    while not (folder / "online.json").exists() and p.poll() is None:
        time.sleep(0.05)
    logs = [work / "consumer.log"]
    cons = [*launcher(), *(["-c", CPU_CONSUMER] if PATCH_LOSS[0] else
                           ["-m", "hsdump.online.consumer"]), folder, "-c", cfg,
            *ranks_override()]  # fmt: skip
    c = run(cons, env, log=logs[0], wait=False)
    killed = capture_killed = None
    plogs = [plog]
    while time.time() - t < a.timeout:
        if p.poll() is not None:
            break
        if kill_capture_at and capture_killed is None:
            n = len(published_ids(folder))
            if n >= kill_capture_at:  # SIGKILL mid-epoch, then the same command again
                p.kill()
                p.wait()
                capture_killed = dict(at_published=n)
                plogs.append(work / "producer-restarted.log")
                p = run(prod, env, log=plogs[-1], wait=False)
        if kill_at and killed is None:
            step = durable_step(folder)
            ckpt = work / "train" / "run" / f"{KIND}-latest"
            if (
                step
                and step >= kill_at
                and ckpt.exists()
                and ckpt.resolve().name.endswith(f"-step{step}")
            ):  # its newest checkpoint is its acknowledged step: SIGKILL, then resume from it
                kill_tree(c.pid)  # the trainer's every process: torchrun's workers too
                c.wait()
                killed = dict(at_step=step, resumed_from=ckpt.resolve().name)
                logs.append(work / "consumer-resumed.log")
                resume = f"training.resume_from={ckpt.resolve()}"
                # a checkpoint a step was for the kill (SpecForge resumes from the last durable
                # step's only); the resumed trainer saves as asked (0: at its end), not 500 times
                every = f"training.save_interval={a.save_interval}"
                c = run([*cons, resume, every], env, log=logs[1], wait=False)
        time.sleep(0.05)
    wall = time.time() - t
    rc_c = c.wait(timeout=a.timeout)
    peak = sampler.stop()
    if p.returncode or rc_c:
        raise SystemExit(f"producer rc {p.returncode}: {plogs[-1].read_text()[-3000:]}\nconsumer "
                         f"rc {rc_c}: {logs[-1].read_text()[-3000:]}")  # fmt: skip
    out = plogs[-1].read_text()
    summary = json.loads(out.strip().splitlines()[-1])
    capture_s = sum(e["wall_s"] for e in summary["epochs"])
    plan = json.loads((folder / "online.json").read_text())
    ids = published_ids(folder)
    with sqlite3.connect(folder / "control" / "consumer.sqlite") as db:
        acked_ids = {r[0] for r in db.execute("SELECT sample_id FROM acked")}
    expected = plan["samples_per_epoch"] * a.epochs - summary["dropped_at_end"]
    steps = [r[0] for r in (
        [r for r in losses(logs[0]) if not killed or r[0] <= killed["at_step"]]
        + [r for log in logs[1:] for r in losses(log)])]  # fmt: skip
    if capture_killed is not None:
        capture_killed.update(restarted=True, published_after=len(ids))
    sent = bytes_published(folder)
    from hsdump.online.folder import ShardBook

    book = ShardBook(folder)
    book.refresh()
    tokens = sum(book.length_of.get(i, 0) for i in set(ids))
    return dict(
        bytes_published=sent,
        cap_share_of_published=round(cap / sent, 4) if cap and sent else None,
        # across the kills: published twice (a ref written again), lost (neither trained nor
        # left to a tail SpecForge drops), trained twice (an optimizer step logged twice)
        published_twice=len(ids) - len(set(ids)),
        samples_lost=max(0, expected - len(acked_ids)),
        steps_trained_twice=len(steps) - len(set(steps)),
        capture_killed=capture_killed,
        cap_bytes=cap,
        peak_bytes=peak,
        peak_accounted_bytes=summary["peak_accounted_bytes"],
        peak_sampled_times=sampler.samples,
        samples_published=len(set(ids)),  # across a capture restart: its refs
        samples_consumed=acked(folder),
        dropped_at_end=summary["dropped_at_end"],
        samples_per_epoch=plan["samples_per_epoch"],
        sample_bytes_max=plan["sample_bytes_max"],
        capture_s=round(capture_s, 2),
        capture_samples_per_s=round(summary["samples_published"] / capture_s, 3),
        # every published sample's tokens over the run's wall time, the trainer beside it (its
        # engine's start and a restart included: compare with the offline capture_alone's)
        capture_tokens_per_s_with_trainer=round(tokens / wall, 1),
        tokens_published=tokens,
        gate_wait_s=summary["gate_wait_s"],
        trainer_data_wait_s=data_wait_s([x for x in logs if x.exists()]),
        wall_s=round(wall, 2),
        store_left_bytes=dir_bytes(folder / "store"),
        losses=[r for r in losses(logs[0]) if not killed or r[0] <= killed["at_step"]]
        + [r for log in logs[1:] for r in losses(log)],
        trainer_killed=killed,
        engine_starts=summary.get("engine_starts"),
        **({"vocab_map_equal_to_offline": same_map(work, off)} if KIND == "eagle3" else {}),
    )


def same_map(work: Path, off: dict) -> bool:
    """Whether the vocabulary map the consumer built from the capture's counts is the one
    SpecForge's offline trainer derived from the export (its d2t and t2d equal)."""
    import torch

    maps = sorted((work / "train" / "cache" / "vocab_mapping").glob("hsdump-*.pt"))
    if len(maps) != 1 or not off["vocab_mapping"]:
        return False
    a, b = (torch.load(m, weights_only=True) for m in (maps[0], off["vocab_mapping"]))
    return all(torch.equal(a[k], b[k]) for k in ("d2t", "t2d"))


def run(cmd, env, log: Path = None, wait=True):
    cmd = [str(c) for c in cmd]
    out = open(log, "w") if log else subprocess.PIPE
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    if not wait:
        return p
    text, _ = p.communicate(timeout=1800)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)}: rc {p.returncode}\n"
                         f"{(log.read_text() if log else text)[-3000:]}")  # fmt: skip
    return p


def command_args(argv) -> list:
    """The command line without --work (a scratch folder of this machine)."""
    args, out = list(argv if argv is not None else sys.argv[1:]), []
    while args:
        x = args.pop(0)
        if x == "--work":
            args.pop(0)
        elif not x.startswith("--work="):
            out.append(x)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/online-cpu.json"))
    ap.add_argument("--work", default="/tmp/hsdump-online-bench")
    ap.add_argument("--samples", type=int, default=24, help="samples per epoch")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--cap", type=int, default=0, help="bytes (0: 4 windows of the longest sample)")
    ap.add_argument("--pace", type=float, default=150.0, help="capture tokens/s (dry engine)")
    ap.add_argument("--engine", default="dry", choices=("dry", "cpu", "gpu"),
                    help="dry: rows of the tiny Llama's shapes; cpu: SGLang's engine on the "
                    "CPU, the model's own hidden states")  # fmt: skip
    ap.add_argument("--model", default="tiny", help="the capture's conf/model preset")
    ap.add_argument("--data", default=None,
                    help="a conversations file (hsdump export --to messages: regenerated answers)"
                    " for every capture; default the model preset's dataset")  # fmt: skip
    ap.add_argument("--data-format", default="messages")
    ap.add_argument("--ranks", type=int, default=1,
                    help="the trainer's processes (torchrun; online.dp_size), each trainer's")  # fmt: skip
    ap.add_argument("--capture-arg", action="append", default=[],
                    help="an extract.py override for every capture, e.g. "
                    "engine.mem_fraction_static=0.5 on a GPU the trainer shares")  # fmt: skip
    ap.add_argument("--save-interval", type=int, default=0)
    ap.add_argument("--runs", default="uncapped,capped")
    ap.add_argument("--kill-trainer-at", type=int, default=5,
                    help="capped run: SIGKILL the trainer after this step, resume it")  # fmt: skip
    ap.add_argument("--kill-capture-at", type=int, default=0,
                    help="capped run: SIGKILL the capture once it has published this many "
                    "samples, then start it again with the same command (0: no kill)")  # fmt: skip
    ap.add_argument("--kind", default="dflash", choices=("dflash", "eagle3"),
                    help="the drafter SpecForge trains (eagle3: its loss in eager torch on the "
                    "CPU, bf16; the online run's vocabulary map from the capture's counts)")  # fmt: skip
    ap.add_argument("--ttt-length", type=int, default=3, help="EAGLE-3's unrolled draft steps")
    ap.add_argument("--anchors", type=int, default=16, help="DFlash's num_anchors (recipe: 512)")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                    help="the trainer's model.torch_dtype: float32 on the CPU (bf16 matmuls "
                    "are 40x slower on one without native bf16); the online store hands the "
                    "records over in it, the offline run reads float32 copies")  # fmt: skip
    ap.add_argument(
        "--specforge",
        default=os.environ.get("HSDUMP_SPECFORGE_SRC", str(CACHE / "specforge-0.2.0")),
    )
    ap.add_argument(
        "--accelerate",
        default=os.environ.get("HSDUMP_ACCELERATE_SRC", str(CACHE / "accelerate-1.15.0")),
    )
    a = ap.parse_args(argv)  # fmt: skip
    global KIND
    KIND = a.kind
    PATCH_LOSS[0] = KIND == "eagle3" and a.engine != "gpu"  # a GPU runs SpecForge's own kernel
    if a.data:
        DATA[:] = [f"dataset.path={Path(a.data).resolve()}", f"dataset.format={a.data_format}"]
    EXTRA[:] = a.capture_arg
    RANKS[0] = a.ranks
    if a.ranks > 1 and PATCH_LOSS[0]:
        raise SystemExit("--ranks > 1 with --kind eagle3 on the CPU: its loss patch runs in one "
                         "process only")  # fmt: skip
    if a.dtype is None:  # SpecForge 0.2.0 loads EAGLE-3's target head in bf16 only
        a.dtype = "bfloat16" if KIND == "eagle3" else "float32"
    elif KIND == "eagle3" and a.dtype != "bfloat16":
        raise SystemExit("--kind eagle3 trains in bfloat16 (SpecForge 0.2.0 loads EAGLE-3's "
                         "target head in bf16 only): leave --dtype out or pass bfloat16")  # fmt: skip
    for root in (a.specforge, a.accelerate):
        if not Path(root).is_dir():
            raise SystemExit(f"{root}: not found; `make test` fetches it, or pass its root")
    env = peer_env(a.specforge, a.accelerate)
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    off = offline(work / "offline", a, env)
    runs = {}
    for name in a.runs.split(","):
        cap = 0
        if name == "capped":
            cap = a.cap or cap_for(work / "offline" / "ds", a)
        runs[name] = online(work / name, a, env, off, cap, a.kill_trainer_at if cap else 0,
                            a.kill_capture_at if cap else 0)  # fmt: skip
    c, u = runs.get("capped"), runs.get("uncapped")
    main_run = c or u
    result = {
        "consumer": "specforge",
        "specforge_version": "0.2.0",
        "kind": KIND,
        "engine": (
            f"dry ({model_path(a.model)} shapes)"
            if a.engine == "dry"
            else engine_name(a.model, a.engine)
        ),
        "cap_bytes": main_run["cap_bytes"],
        "peak_bytes": main_run["peak_bytes"],
        "bytes_published": main_run["bytes_published"],
        "gpu": gpu_name() if a.engine == "gpu" else None,
        "waits": dict(
            capture_at_cap_s=main_run["gate_wait_s"],
            trainer_for_data_s=main_run["trainer_data_wait_s"],
        ),  # fmt: skip
        "capture_tokens_per_s": dict(
            with_trainer=main_run["capture_tokens_per_s_with_trainer"],
            alone=off["capture_alone"]["tokens_per_s"],
        ),
        "kills": dict(
            trainer=main_run["trainer_killed"],
            capture=main_run["capture_killed"],
            samples_lost=main_run["samples_lost"],
            published_twice=main_run["published_twice"],
            steps_trained_twice=main_run["steps_trained_twice"],
        ),
        "epochs": a.epochs,
        "samples_published": main_run["samples_published"],
        "samples_consumed": main_run["samples_consumed"],
        "loss_equal_to_offline": all(r["losses"] == off["losses"] for r in runs.values()),
        "loss_max_abs_diff_to_offline": max(
            loss_diff(r["losses"], off["losses"]) for r in runs.values()
        ),  # fmt: skip
        "capture_samples_per_s_capped": c and c["capture_samples_per_s"],
        "capture_samples_per_s_uncapped": u and u["capture_samples_per_s"],
        "capped_over_uncapped": (
            round(c["capture_samples_per_s"] / u["capture_samples_per_s"], 3) if c and u else None
        ),
        "uncapped_peak_bytes": u and u["peak_bytes"],
        "steps": len(off["losses"]),
        "offline": dict(
            losses=off["losses"],
            train_s=off["train_s"],
            records=off["records"],
            capture_alone=off["capture_alone"],
        ),  # fmt: skip
        "runs": runs,
        "settings": dict(
            samples=a.samples,
            batch=a.batch,
            ranks=a.ranks,
            max_len=a.max_len,
            pace=a.pace,
            command=" ".join(["python", "bench/online_bench.py", *command_args(argv)]),
        ),  # fmt: skip
        "host": os.uname().nodename,
        "cpus": os.cpu_count(),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'run':10s} {'cap':>10s} {'peak':>10s} {'published':>9s} {'consumed':>8s} "
          f"{'samples/s':>9s} {'loss = offline':>14s}")  # fmt: skip
    for name, r in runs.items():
        print(f"{name:10s} {r['cap_bytes']:>10,} {r['peak_bytes']:>10,} "
              f"{r['samples_published']:>9} {r['samples_consumed']:>8} "
              f"{r['capture_samples_per_s']:>9.3f} {str(r['losses'] == off['losses']):>14s}")  # fmt: skip
    print(f"offline: {len(off['losses'])} steps; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
