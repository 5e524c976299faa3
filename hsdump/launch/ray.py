"""`python -m hsdump ray [options] [--] OVERRIDES...`: N hsdump jobs as Ray tasks, one dataset.

For Ray clusters (Kubernetes through KubeRay, clouds) where SLURM is not there. Each job is one
Ray task that requests its resources (`--num-gpus`, `--num-cpus`, `--resources` per job) and
runs exactly one `python extract.py OVERRIDES dist.num_jobs=N dist.job_index=i` as a
subprocess (SGLang starts its own processes; a subprocess keeps every job isolated and
killable: it dies with its Ray worker). A job that exits non-zero raises, so Ray runs it again
(`--max-retries`, default 3); the re-run resumes (committed samples are not recomputed).
All jobs write one `output.dir`, which must be on a file system every node mounts.
With `dist.nodes_per_engine=N` each job's engine spans N nodes: the job is N tasks in a
placement group (one bundle per node, STRICT_SPREAD) running the same command with
`engine.nnodes=N engine.node_rank=i engine.dist_init_addr=<node 0>:<port>` (hsdump.capture.nodes);
those tasks are not retried one by one. The driver
waits for all jobs, prints one line per job, and exits 1 naming the jobs that used up their
retries (re-run just those with `--only`; they resume).

Why not a Hydra launcher (`python extract.py -m hydra/launcher=ray`): Hydra 1.3 instantiates a
launcher only from the `hydra_plugins` package (`Plugins._instantiate` refuses any other
`_target_`), and hydra-ray-launcher 1.2.2 pins `cloudpickle<3` where SGLang's dependencies pin
`cloudpickle==3.1.3`.

The cluster: `--address`, else `RAY_ADDRESS` (set by `ray job submit`), else a cluster started
with `ray start` on this machine, else a local Ray instance that this command starts and stops.

Exit status: 0 when every job succeeded, 1 when a job failed after its retries, 2 on a usage
or configuration error, 3 when interrupted (Ctrl-C; the jobs commit what is complete).

Test hook (like HSDUMP_FAULT): `HSDUMP_RAY_FAULT=JOB:POINT@N` in the driver's environment sets
`HSDUMP_FAULT=POINT@N` for the first attempt of job JOB only, so a test can kill one job once
and watch Ray re-run it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hsdump.errors import Refusal

ROOT = Path(__file__).resolve().parents[2]
EXTRACT = ROOT / "extract.py"  # a checkout; an installed hsdump runs `python -m hsdump extract`
PROG = "python -m hsdump ray"
TAIL_LINES = 40
EXIT_BAD_INPUT = 2  # extract.py: a config or input error, the same on every attempt
STOP_GRACE_S = 120.0  # after SIGTERM a job commits what is complete; then it is killed


# ----------------------------------------------------------------------------- job side
class JobError(RuntimeError):
    """One attempt of a job exited non-zero."""

    def __init__(self, job: int, attempt: int, returncode: int, tail: List[str]):
        super().__init__(job, attempt, returncode, tail)
        self.job, self.attempt, self.returncode, self.tail = job, attempt, returncode, tail

    def __str__(self) -> str:
        return (
            f"job {self.job} attempt {self.attempt}: {describe_exit(self.returncode)}; last "
            "lines of its output:\n" + "\n".join(self.tail[-15:])
        )


class JobFailed(JobError):
    """A failed attempt that Ray runs again (the re-run resumes): killed, engine death,
    interrupted (exit status 3), any other error."""


class JobRefused(JobError):
    """extract.py refused its input (exit status 2): a re-run would refuse it again, so Ray
    does not retry it (only JobFailed is in `retry_exceptions`)."""


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


@dataclass
class JobSpec:
    """What one Ray task runs: job `index` of `num_jobs`, plus how to run it."""

    index: int
    num_jobs: int
    overrides: List[str]
    env: Dict[str, str] = field(default_factory=dict)
    log_dir: str = ""
    """Per-attempt folders (hydra run dir and output.log), relative to the repository root of
    the node that runs the job, or absolute."""
    fault_once: str = ""
    """HSDUMP_FAULT for the first attempt only (the HSDUMP_RAY_FAULT test hook)."""
    nodes: int = 1
    """Nodes of this job's one engine (dist.nodes_per_engine): one task per node."""
    rank: int = 0
    """This task's node in the engine."""
    dist_init_addr: str = ""
    """host:port of the engine's node 0 (nodes > 1)."""

    def command(self, attempt: int) -> List[str]:
        app = [str(EXTRACT)] if EXTRACT.is_file() else ["-m", "hsdump", "extract"]
        args = [
            sys.executable,
            *app,
            *self.overrides,
            f"dist.num_jobs={self.num_jobs}",
            f"dist.job_index={self.index}",
        ]
        if self.nodes > 1:
            args += [
                f"dist.nodes_per_engine={self.nodes}",
                f"engine.nnodes={self.nodes}",
                f"engine.node_rank={self.rank}",
                f"engine.dist_init_addr={self.dist_init_addr}",
            ]
        if self.log_dir and not any(
            o.startswith(("hydra.run.dir=", "+hydra.run.dir=")) for o in self.overrides
        ):
            args.append(f"hydra.run.dir={self.attempt_dir(attempt)}")
        return args

    def attempt_dir(self, attempt: int) -> str:
        node = f"-node{self.rank}" if self.nodes > 1 else ""
        return f"{self.log_dir}/job{self.index}{node}-attempt{attempt}"


def job_cwd() -> Path:
    """Where a job runs: the checkout holding extract.py (relative paths in the overrides
    resolve against it, as for `python extract.py`), else the Ray worker's own folder."""
    return ROOT if EXTRACT.is_file() else Path.cwd()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:  # PR_SET_PDEATHSIG: SIGKILL when the Ray worker that started the job dies
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except Exception:
        pass


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM: hsdump commits what is complete and exits 3. It ignores the signal while its
    engine starts, so the signal is repeated every 10 s; after STOP_GRACE_S, SIGKILL (what
    was committed stays either way)."""
    deadline = time.time() + STOP_GRACE_S
    while time.time() < deadline:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=min(10.0, max(deadline - time.time(), 0.1)))
            return
        except subprocess.TimeoutExpired:
            pass
    proc.kill()


def run_job(spec: JobSpec, tracker: Any = None) -> Dict[str, Any]:
    """The body of one Ray task: one attempt of job `spec.index`. Returns a report dict, or
    raises JobFailed (retried) / JobRefused (not) with the last lines of the job's output."""
    import ray

    node = ray.util.get_node_ip_address()
    attempt = 1
    if tracker is not None:
        try:
            attempt = ray.get(tracker.begin.remote(spec.index, node))
        except Exception:  # the bookkeeping is best effort; the job runs anyway
            attempt = 0
    env = dict(os.environ)
    env.pop("HSDUMP_FAULT", None)
    env.update(spec.env)
    env["HSDUMP_RAY_JOB"], env["HSDUMP_RAY_ATTEMPT"] = str(spec.index), str(attempt)
    if spec.fault_once and attempt == 1:
        env["HSDUMP_FAULT"] = spec.fault_once
    from hsdump.command import SUMMARY_ENV

    fd, summary_file = tempfile.mkstemp(prefix="hsdump-summary-", suffix=".json")
    os.close(fd)
    env[SUMMARY_ENV] = summary_file
    tag = f"[job {spec.index}/{spec.num_jobs} attempt {attempt}]"
    log_file = None
    if spec.log_dir:
        d = Path(spec.attempt_dir(attempt))
        d = d if d.is_absolute() else job_cwd() / d
        d.mkdir(parents=True, exist_ok=True)
        log_file = open(d / "output.log", "w", buffering=1)
    cmd = spec.command(attempt)
    print(f"{tag} on {node}: {' '.join(cmd)}", flush=True)
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    t0 = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=str(job_cwd()),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )

    def pump() -> None:  # the job's output: Ray forwards it to the driver; kept in output.log
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            if log_file is not None:
                log_file.write(line + "\n")
            print(f"{tag} {line}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    # Ray cancels a running task with a simulated SIGINT (a KeyboardInterrupt), which does
    # nothing where SIGINT is ignored (workers of a cluster started in the background)
    sigint = signal.getsignal(signal.SIGINT)
    if sigint is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:  # short waits: Ray's cancel (a KeyboardInterrupt) lands between them
            try:
                rc = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
    except BaseException:  # cancelled (driver Ctrl-C): let the job commit what is complete
        print(f"{tag} cancelled: stopping the job (SIGTERM)", flush=True)
        stop(proc)
        raise
    finally:
        if sigint is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, sigint)
        _kill_group(proc.pid, signal.SIGKILL)  # SGLang processes left behind, if any
        reader.join(timeout=10)
        if log_file is not None:
            log_file.close()
    seconds = time.time() - t0
    summary = _read_summary(summary_file)
    if tracker is not None:
        try:
            ray.get(tracker.end.remote(spec.index, attempt, rc, seconds))
        except Exception:
            pass
    if rc != 0:
        print(f"{tag} failed: {describe_exit(rc)} after {seconds:.0f} s", flush=True)
        cls = JobRefused if rc == EXIT_BAD_INPUT else JobFailed
        raise cls(spec.index, attempt, rc, list(tail))
    return {
        "job": spec.index,
        "attempt": attempt,
        "node": node,
        "seconds": seconds,
        "summary": summary,
    }


def _read_summary(path: str) -> Optional[dict]:
    """The job's summary (hsdump.pipeline.Summary.to_dict), written by `extract` when it
    completes; None if it did not. The file is removed."""
    try:
        text = Path(path).read_text()
        return json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def summary_text(s: Optional[dict]) -> str:
    """One line of a job's summary for the driver's report."""
    if not s:
        return ""
    return (
        f"samples written: {s['written']}, already committed before this run: "
        f"{s['already_done']} | wall time: {s['wall_s']:.1f} s "
        f"(engine start {s['engine_start_s']:.1f} s)"
    )


class Attempts:
    """A Ray actor (num_cpus=0) that numbers each job's attempts and records how each ended,
    so the driver can say which jobs Ray re-ran and why."""

    def __init__(self) -> None:
        self.log: Dict[int, List[Dict[str, Any]]] = {}

    def begin(self, job: int, node: str) -> int:
        self.log.setdefault(job, []).append({"node": node, "rc": None, "seconds": None})
        return len(self.log[job])

    def end(self, job: int, attempt: int, rc: int, seconds: float) -> None:
        self.log[job][attempt - 1].update(rc=rc, seconds=seconds)

    def report(self) -> Dict[int, List[Dict[str, Any]]]:
        return self.log


# ----------------------------------------------------------------------------- driver side
def parse_args(argv: List[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Run N hsdump jobs (one SGLang engine each) as Ray tasks that all write "
        "one dataset. Every argument that is not an option below is a Hydra "
        "override for extract.py (model=..., engine=..., output.dir=...).",
        epilog="example: python -m hsdump ray --num-jobs 4 --num-gpus 1 -- model=llama3_8b "
        "engine=gpu dataset=sharegpt_v3 output.dir=/shared/hs/llama3",
    )
    ap.add_argument(
        "--num-jobs",
        type=int,
        default=None,
        help="jobs to split the dataset into (or give dist.num_jobs=N)",
    )
    ap.add_argument(
        "--num-gpus",
        type=float,
        default=None,
        help="GPUs per job; default: model.tp_size x engine.extra.dp_size with "
        "engine.device=cuda, 0 on the CPU",
    )
    ap.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per job (default 1)")
    ap.add_argument(
        "--memory",
        type=float,
        default=None,
        help="bytes of memory per job (Ray's `memory` resource; default none)",
    )
    ap.add_argument(
        "--resources",
        type=json.loads,
        default=None,
        metavar="JSON",
        help="custom Ray resources per job, e.g. '{\"H200\": 1}'",
    )
    ap.add_argument(
        "--max-retries",
        type=int,
        default=3,
        help="re-runs of a failed job before giving up (default 3; -1: no limit)",
    )
    ap.add_argument(
        "--only",
        default=None,
        metavar="I,J,...",
        help="run only these job indices (re-run the jobs that failed)",
    )
    ap.add_argument(
        "--address",
        default=None,
        help="Ray cluster to use (default: RAY_ADDRESS, then a cluster started "
        "on this machine, else a local instance started for this run)",
    )
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment variable for every job (repeatable)",
    )
    ap.add_argument(
        "--log-dir",
        default=None,
        help="folder for each attempt's hydra run dir and output.log, relative to "
        "the repository root on each node (default outputs/.ray/<time>)",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for extract.py")
    # options may follow the overrides: `ray model=tiny --num-jobs 2` works too
    return ap.parse_intermixed_args(argv)


def split_overrides(overrides: List[str], num_jobs: Optional[int]) -> Tuple[List[str], int]:
    """Take dist.num_jobs out of the overrides (it and --num-jobs must agree); refuse
    dist.job_index (every job gets its own), -m and sweeps."""
    rest, from_override = [], None
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if o in ("-m", "--multirun"):
            raise Refusal("no -m: the Ray launch is one run; each job gets its own dist.job_index")
        if key == "dist.job_index":
            raise Refusal(
                f"{o}: every job gets its own dist.job_index; to run some jobs only, use --only I,J"
            )
        if key == "dist.num_jobs":
            from_override = int(value)
            continue
        if key in ("engine.nnodes", "engine.node_rank", "engine.dist_init_addr"):
            raise Refusal(
                f"{o}: the Ray launch places each engine's nodes itself; give "
                "dist.nodes_per_engine=N"
            )
        rest.append(o)
    if num_jobs is not None and from_override is not None and num_jobs != from_override:
        raise Refusal(f"--num-jobs {num_jobs} and dist.num_jobs={from_override} disagree")
    n = num_jobs if num_jobs is not None else from_override
    if n is None:
        raise Refusal("say how many jobs: --num-jobs N (or dist.num_jobs=N)")
    if n < 1:
        raise Refusal(f"{n} jobs: need at least 1")
    return rest, n


def compose(overrides: List[str], num_jobs: int) -> Any:
    """The config job 0 would run (hydra.* overrides accepted and dropped), checked by the
    schema, so a typo fails here once instead of in N tasks on the cluster."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import open_dict

    from hsdump.command import config_dir  # the checkout's conf/, or the installed package's
    from hsdump.config import register_configs, to_config

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = hydra_compose(
            "config",
            overrides=[*overrides, f"dist.num_jobs={num_jobs}", "dist.job_index=0"],
            return_hydra_config=True,
        )
    with open_dict(cfg):
        del cfg["hydra"]
    return to_config(cfg)


def default_gpus(cfg: Any) -> float:
    """GPUs of one task: the engine's (TP x DP replicas; TP under DP attention), divided by
    the nodes it spans."""
    if not str(cfg.engine.device).startswith("cuda"):
        return 0.0
    dp = (
        1
        if cfg.engine.extra.get("enable_dp_attention")
        else int(cfg.engine.extra.get("dp_size", 1) or 1)
    )
    return float(cfg.model.tp_size * dp) / cfg.dist.nodes_per_engine


def connect(address: Optional[str]) -> bool:
    """ray.init; True when this command started the Ray instance (and owns it)."""
    import ray

    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or "auto", log_to_driver=True)
        return False
    try:  # a cluster started with `ray start` on this machine
        ray.init(address="auto", log_to_driver=True)
        return False
    except ConnectionError:
        pass
    ray.init(address="local", log_to_driver=True)  # this machine's CPUs and GPUs
    return True


def check_fits(options: Dict[str, Any]) -> Optional[str]:
    """A warning when no alive node has one job's resources (an autoscaler may add one)."""
    import ray

    need = {"CPU": options.get("num_cpus") or 0, "GPU": options.get("num_gpus") or 0}
    need.update(options.get("resources") or {})
    if options.get("memory"):
        need["memory"] = options["memory"]
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if any(all(r.get(k, 0) >= v for k, v in need.items() if v) for r in nodes):
        return None
    have = (
        "; ".join(
            ", ".join(f"{k}={v:g}" for k, v in sorted(r.items()) if k in need) or "none"
            for r in nodes
        )
        or "no alive node"
    )
    return (
        f"no node of this cluster has one job's resources ({need}); nodes have: {have}. "
        "The jobs wait until the cluster has such a node (autoscaling), or forever."
    )


def ray_options(args: argparse.Namespace, num_gpus: float) -> Dict[str, Any]:
    opts: Dict[str, Any] = {
        "num_cpus": args.num_cpus,
        "num_gpus": num_gpus,
        "max_retries": args.max_retries,
        # JobRefused (bad input, exit 2) is left out: it would fail again
        "retry_exceptions": [JobFailed],
    }
    if args.memory:
        opts["memory"] = args.memory
    if args.resources:
        opts["resources"] = dict(args.resources)
    return opts


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse: 0 for --help, 2 for usage errors
        return int(e.code or 0)

    def refuse(msg: str) -> int:
        print(f"{PROG}: {msg}", file=sys.stderr)
        return 2

    try:
        overrides, num_jobs = split_overrides(args.overrides, args.num_jobs)
        env = dict(kv.split("=", 1) for kv in args.env)
        guard = "HSDUMP_FORBID_ENGINE"  # hsdump.capture.base.FORBID_ENV: the test tiers' guard
        if os.environ.get(guard):  # reaches the jobs too (tests/conftest.py)
            env.setdefault(guard, os.environ[guard])
        only = (
            sorted({int(x) for x in args.only.split(",") if x.strip()})
            if args.only
            else list(range(num_jobs))
        )
        cfg = compose(overrides, num_jobs)
    except Exception as e:  # bad overrides: hydra's and the schema's messages name the key
        return refuse(str(e))
    bad = [i for i in only if not 0 <= i < num_jobs]
    if bad or not only:
        return refuse(f"--only {args.only}: job indices are 0..{num_jobs - 1}")
    if cfg.output.overwrite:
        return refuse(
            "output.overwrite=true: a retried job would delete what the others "
            "committed; empty the folder once before launching instead"
        )
    num_gpus = args.num_gpus if args.num_gpus is not None else default_gpus(cfg)
    out_dir = Path(cfg.output.dir)

    import ray

    owned = connect(args.address)
    try:
        if not out_dir.is_absolute():
            if not owned:
                return refuse(
                    f"output.dir={out_dir} is relative: every node of the cluster "
                    "would resolve it on its own disk. Give output.dir (or "
                    "output.root) an absolute path on a file system all nodes mount"
                )
            out_dir = out_dir.resolve()  # a local instance: the jobs run where this runs
        overrides = [o for o in overrides if o.lstrip("+~").partition("=")[0] != "output.dir"] + [
            f"output.dir={out_dir}"
        ]
        log_dir = args.log_dir or f"outputs/.ray/{time.strftime('%Y-%m-%d_%H-%M-%S')}"
        options = ray_options(args, num_gpus)
        warning = check_fits(options)
        if warning:
            print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
        plan = Launch(
            jobs=only,
            num_jobs=num_jobs,
            overrides=overrides,
            env=env,
            log_dir=log_dir,
            options=options,
            out_dir=out_dir,
            argv=list(argv),
            nodes=cfg.dist.nodes_per_engine,
            fault=os.environ.get("HSDUMP_RAY_FAULT", ""),
        )
        return launch(ray, plan)
    finally:
        if owned:
            ray.shutdown()


def node0_address() -> str:
    """Runs on the first node of an engine: its IP and a port free there (SGLang's
    dist_init_addr; the engine binds it a moment later)."""
    import socket

    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"{ray.util.get_node_ip_address()}:{port}"


def start_engine_tasks(ray, spec: JobSpec, nodes: int, options: Dict[str, Any], tracker):
    """One job whose engine spans `nodes` nodes: a placement group of one bundle per node
    (STRICT_SPREAD: each on its own node), node 0's address found on the first bundle, then
    one task per node running the same command with its node_rank. The tasks are not retried
    one by one (a node's engine cannot rejoin alone): a failed job is re-run whole with --only,
    and resumes. Returns (placement group, [ref per node])."""
    import dataclasses

    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = {"CPU": options["num_cpus"], "GPU": options["num_gpus"]}
    bundle.update(options.get("resources") or {})
    if options.get("memory"):
        bundle["memory"] = options["memory"]
    pg = placement_group(
        [{k: v for k, v in bundle.items() if v}] * nodes,
        strategy="STRICT_SPREAD",
        name=f"hsdump-job{spec.index}",
    )
    ray.get(pg.ready())

    def on(rank):
        return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank)

    addr = ray.get(
        ray.remote(num_cpus=0)(node0_address).options(scheduling_strategy=on(0)).remote()
    )
    opts = {k: v for k, v in options.items() if k not in ("retry_exceptions", "max_retries")}
    refs = []
    for rank in range(nodes):
        one = dataclasses.replace(spec, nodes=nodes, rank=rank, dist_init_addr=addr)
        refs.append(
            ray.remote(run_job)
            .options(**opts, max_retries=0, scheduling_strategy=on(rank))
            .remote(one, tracker if rank == 0 else None)
        )
    return pg, refs


@dataclass(frozen=True)
class Launch:
    """What `launch` runs: checked by `main` before Ray is touched."""

    jobs: List[int]  # the job indices to run (--only, or all)
    num_jobs: int
    overrides: List[str]  # every job's, output.dir absolute
    env: Dict[str, str]  # the jobs' extra environment (--env)
    log_dir: str
    options: Dict[str, Any]  # Ray's task options (ray_options)
    out_dir: Path
    argv: List[str]  # the command as given: the report's rerun line
    nodes: int = 1  # dist.nodes_per_engine
    fault: str = ""  # HSDUMP_RAY_FAULT, "JOB:SPEC": that job's first attempt gets SPEC

    def fault_once(self, job: int) -> str:
        fault_job, _, spec = self.fault.partition(":")
        return spec if fault_job.strip() == str(job) else ""


def launch(ray, plan: Launch) -> int:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    only, num_jobs, overrides, env = plan.jobs, plan.num_jobs, plan.overrides, plan.env
    log_dir, options, out_dir, argv, nodes = (
        plan.log_dir,
        plan.options,
        plan.out_dir,
        plan.argv,
        plan.nodes,
    )

    here = ray.get_runtime_context().get_node_id()
    tracker = (
        ray.remote(num_cpus=0)(Attempts)
        .options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=True))
        .remote()
    )
    task = ray.remote(run_job).options(**options)
    print(
        f"{PROG}: {len(only)} of {num_jobs} jobs -> {out_dir} (per job: "
        f"{options['num_gpus']:g} GPU, {options['num_cpus']:g} CPU; "
        f"max_retries={options['max_retries']}; logs under {log_dir})",
        flush=True,
    )
    t0 = time.time()
    # `ray job stop` and schedulers send SIGTERM: stop like Ctrl-C (the jobs commit first)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    refs = {}  # ref -> (job, node rank)
    groups = {}  # job -> its placement group (engines over several nodes)
    for i in only:
        spec = JobSpec(
            index=i,
            num_jobs=num_jobs,
            overrides=list(overrides),
            env=env,
            log_dir=log_dir,
            fault_once=plan.fault_once(i),
        )
        if nodes > 1:
            groups[i], gang = start_engine_tasks(ray, spec, nodes, options, tracker)
            refs.update({ref: (i, rank) for rank, ref in enumerate(gang)})
        else:
            refs[task.remote(spec, tracker)] = (i, 0)
    results: Dict[int, Any] = {}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i, rank = refs[ref]
                try:
                    res = ray.get(ref)
                except JobError as e:  # a RayTaskError(JobFailed): its cause is ours
                    cause = getattr(e, "cause", None)
                    res = cause if isinstance(cause, JobError) else e
                except ray.exceptions.RayError as e:  # worker or node lost for good
                    res = e
                if rank == 0 or not isinstance(res, dict):  # node 0 reports; any node fails
                    if not isinstance(results.get(i), Exception):
                        results[i] = res
                left = [r for r in pending if refs[r][0] == i]
                if left:
                    continue
                if i in groups:
                    from ray.util.placement_group import remove_placement_group

                    remove_placement_group(groups.pop(i))
                print(
                    f"{PROG}: job {i}: {'done' if isinstance(results[i], dict) else 'FAILED'}"
                    f" ({len(results)}/{len(only)} finished)",
                    flush=True,
                )
    except KeyboardInterrupt:
        print(
            f"{PROG}: interrupted: stopping the jobs (each commits what is complete)",
            file=sys.stderr,
            flush=True,
        )
        for ref in pending:
            ray.cancel(ref)
        ray.wait(pending, num_returns=len(pending), timeout=STOP_GRACE_S + 10)
        print(f"{PROG}: run the same command again to resume", file=sys.stderr)
        return 3
    try:
        attempts = ray.get(tracker.report.remote())
    except Exception:
        attempts = {}
    wall = time.time() - t0
    time.sleep(1.0)  # let Ray forward the jobs' last lines before the report
    print(f"\n{PROG}: {len(only)} jobs in {wall:.0f} s")
    failed = []
    for i in only:
        tries = attempts.get(i, [])
        history = "; ".join(
            f"attempt {k} on {a['node']}: "
            + ("running" if a["rc"] is None else "ok" if a["rc"] == 0 else describe_exit(a["rc"]))
            + (f" after {a['seconds']:.0f} s" if a["seconds"] is not None else "")
            for k, a in enumerate(tries, 1)
        )
        r = results.get(i)
        if isinstance(r, dict):
            line = f"job {i}/{num_jobs}: ok after {len(tries) or r['attempt']} attempt(s)"
            if r["summary"]:
                line += " | " + summary_text(r["summary"])
        else:
            failed.append(i)
            why = (
                describe_exit(r.returncode)
                if isinstance(r, JobError)
                else type(r).__name__
                if r is not None
                else "no result"
            )
            line = f"job {i}/{num_jobs}: FAILED ({why}) after {len(tries)} attempt(s)"
        print(line + (f"\n    {history}" if history else ""), flush=True)
    if failed:
        for i in failed:
            r = results.get(i)
            if isinstance(r, JobError) and r.tail:
                print(
                    f"\n--- job {i}, last lines of attempt {r.attempt} ---\n"
                    + "\n".join(r.tail[-20:]),
                    file=sys.stderr,
                )
        again, skip = [], False
        for a in argv:  # the same command without its --only
            if skip or a.startswith("--only"):
                skip = a == "--only" and not skip
                continue
            again.append(a)
        print(
            f"\n{PROG}: {len(failed)} job(s) failed after their retries: "
            f"{','.join(map(str, failed))}. Re-run them (they resume):\n  {PROG} "
            f"--only {','.join(map(str, failed))} {shlex.join(again)}",
            file=sys.stderr,
        )
        return 1
    print(f"dataset: {out_dir} ({len(only)} of {num_jobs} jobs done)")
    return 0


if __name__ == "__main__":  # `python -m hsdump.launch.ray`: run as the importable module
    from hsdump.launch.ray import main as _main

    sys.exit(_main())
