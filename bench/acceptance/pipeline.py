"""The pipelines' step runner: each step a subprocess whose command line, wall time and exit
status are recorded (pipeline.json), steps in threads where their inputs allow, one run-all per
work folder; and the facts of the environment and the datasets a run records."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: the pipelines' steps run there


def python_cmd(*args) -> list:
    """This interpreter with `args` (str'd): a step's command line."""
    return [sys.executable, *map(str, args)]


def package_env(env=None) -> dict:
    """`env` (default: this process's environment) with the repository root on PYTHONPATH
    (last), so that a subprocess started from anywhere finds this package
    (`python -m bench.acceptance...`)."""
    e = dict(os.environ if env is None else env)
    parts = [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in parts:
        parts.append(str(ROOT))
    e["PYTHONPATH"] = os.pathsep.join(parts)
    return e


class Pipeline:
    """The GPU run: each step a subprocess whose command line, wall time and exit status
    are recorded (pipeline.json); steps run in threads where their inputs allow."""

    def __init__(self, a):
        self.a = a
        self.w = Path(a.work)
        self.res = self.w / "results"
        self.logs = self.w / "logs"
        for d in (self.res, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.steps = []
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.failed = []
        self.procs = []
        self.facts = {}
        self.stopped = set()

    def save(self) -> None:
        with self.lock:
            data = dict(
                facts=self.facts,
                steps=self.steps,
                failed=self.failed,
                args=vars(self.a),
                elapsed_s=round(time.time() - self.t0, 1),
            )
            (self.res / "pipeline.json").write_text(json.dumps(data, indent=1) + "\n")

    def run(self, name, cmd, env=None, done=None, check=True):
        """Run `cmd` (a list) unless `done` exists; log to logs/<name>.log."""
        if done is not None and Path(done).exists():
            return 0
        start = time.time() - self.t0
        log = open(self.logs / f"{name}.log", "w")
        print(f"[{start:7.1f}s] start {name}: {shlex.join(cmd)}", flush=True)
        e = dict(os.environ, **(env or {}))
        with self.lock:  # a step stopped before it started never starts
            if name in self.stopped:
                return -1
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=e, cwd=ROOT,
                                 start_new_session=True)  # fmt: skip
            self.procs.append((name, p))
        rc = p.wait()
        end = time.time() - self.t0
        with self.lock:
            self.steps.append(
                dict(
                    name=name,
                    cmd=shlex.join(cmd),
                    env=env or {},
                    start_s=round(start, 1),
                    wall_s=round(end - start, 1),
                    rc=rc,
                )
            )
            if rc != 0:
                self.failed.append(name)
        print(f"[{end:7.1f}s] done  {name} rc={rc} ({end - start:.1f}s)", flush=True)
        self.save()
        if rc != 0 and check:
            raise RuntimeError(f"{name} failed (rc={rc}): see {self.logs / (name + '.log')}")
        return rc

    def stop(self, name, grace_s: float = 20.0) -> None:
        """Step `name` never starts from now on; if it runs: SIGTERM (speculators saves an
        `interrupted/` checkpoint, which is never served), then SIGKILL after `grace_s`."""
        with self.lock:
            self.stopped.add(name)
            procs = [p for n, p in self.procs if n == name and p.poll() is None]
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        end = time.time() + grace_s
        for p in procs:
            while p.poll() is None and time.time() < end:
                time.sleep(0.5)
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def dataset_facts(ds: Path) -> dict:
    """Samples, tokens, loss tokens, bytes and skips of each hsdump dataset (index.json)."""
    out = {}
    for d in sorted(p for p in ds.iterdir() if (p / "index.json").exists()):
        idx = json.loads((d / "index.json").read_text())
        man = json.loads((d / "manifest.json").read_text())
        out[d.name] = dict(
            samples=len(idx["samples"]["id"]),
            tokens=sum(idx["samples"]["length"]),
            loss_tokens=sum(idx["samples"]["masked"]),
            max_len=max(idx["samples"]["length"], default=0),
            bytes=sum(idx["shards"]["bytes"]),
            skipped=idx.get("skipped"),
            layers=man.get("layers"),
            final=man.get("final"),
            template=(man.get("config") or {}).get("model", {}).get("chat_template"),
            tokenized=man.get("tokenized"),
        )
    return out


def env_facts() -> dict:
    import platform

    facts = dict(python=platform.python_version(), date=time.strftime("%Y-%m-%d"))
    from importlib.metadata import version

    for dist in ("torch", "transformers", "sglang", "speculators", "datasets", "triton"):
        try:
            facts[dist] = version(dist)
        except Exception as e:  # noqa: BLE001 - recorded, not needed
            facts[dist] = f"unavailable: {type(e).__name__}"
    try:
        import torch

        if torch.cuda.is_available():
            facts["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        pass
    facts["cpus"] = os.cpu_count()
    return facts


def run_thread(fn, *args):
    box = {}

    def body():
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            box["error"] = e
            print(f"ERROR {e}", flush=True)

    t = threading.Thread(target=body)
    t.start()
    return t, box


def claim_work(w: Path) -> None:
    """One run-all per work folder: a second one (a restart while the first still runs)
    would train into the same checkpoint folders and overwrite its drafters."""
    w.mkdir(parents=True, exist_ok=True)
    pid_file = w / "run-all.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), 0)
        except (ValueError, ProcessLookupError):
            pass
        else:
            raise SystemExit(f"{w}: run-all {pid_file.read_text().strip()} still runs there")
    pid_file.write_text(f"{os.getpid()}\n")


def overlap(P, jobs) -> None:
    """run-all's independent steps side by side (--overlap). A job is ({each step's name: (the
    file that marks it done, the outputs it writes)}, a call that runs those steps unchecked,
    one after the other), each job in its own thread. A step that failed, or that a job which
    raised left without its mark, has its outputs removed, its failure struck from the
    pipeline's and its log kept as NAME-overlapped.log, so that run-all's own sequence, which
    skips what is done, runs it again alone."""
    with P.lock:
        before = len(P.failed)
    ts = [(steps, *run_thread(fn)) for steps, fn in jobs]
    for _, t, _box in ts:
        t.join()
    with P.lock:
        failed = P.failed[before:]
        del P.failed[before:]
    again = []
    for steps, _t, box in ts:
        bad = [s for s, (done, _) in steps.items()
               if s in failed or ("error" in box and not Path(done).exists())]  # fmt: skip
        if not bad:
            continue
        again += bad
        print(f"overlap: {bad} failed beside the others ({box.get('error', 'exit status')}): "
              "run again alone", flush=True)  # fmt: skip
        for s in bad:
            for o in map(Path, steps[s][1]):
                if o.is_dir():
                    shutil.rmtree(o, ignore_errors=True)
                else:
                    o.unlink(missing_ok=True)
            log = P.logs / f"{s}.log"
            if log.exists():
                log.replace(P.logs / f"{s}-overlapped.log")
    P.facts["overlap"] = dict(steps=[s for steps, _ in jobs for s in steps], again_alone=again)
    P.save()
