"""The one way tests run hsdump in a subprocess: `extract.py` (`extract`), any Python script or
module (`python`), and the installed console script (`hsdump`). Every call starts from a clean
environment (no HSDUMP_FAULT, no HF_* or RAY_* settings leaking in from the caller), has a time
limit, and returns (returncode, stdout + stderr), or the running process when `wait=False`.

`DRY` is the override that puts a run on the dry engine (hsdump.capture.dry): tests of hsdump's
own bookkeeping (commits, kills, resume, signals, launchers, sweeps, jobs) use it; tests of
what SGLang decides leave it out and get the real CPU engine of the embedded default.

Every `extract.py` run, a real engine's too (SGLang spawns its scheduler processes as fresh
interpreters), is forked from a server that has already imported torch, transformers,
datasets, Hydra and hsdump and loaded the default tokenizer (tests/zygote.py), so it does not pay ~8 s of
CPU for the imports: it is still a process of its own, with its argv, environment, working
directory, output, exit status and signals, and the script runs as `__main__`. A server is
started per clean environment (`fork_server`: a test that imports sglang in process changes
os.environ for the rest of it), and only runs whose environment differs from the server's in
HSDUMP_* variables (and the flags a child applies: CHILD_FLAGS) are forked (what the imports
read is then the same); `python -m hsdump` and the console script are forked where no engine
can start; every other run,
and every run with HSDUMP_TEST_FORK=0, is a plain subprocess.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Dict, Optional, Sequence, Union

from factories import ROOT

DRY = "engine=dry"
"""extract.py override: the dry engine (no SGLang)."""

_DROP = ("HSDUMP_FAULT", "HF_", "RAY_", "PYTEST_")
FORBID_ENV = "HSDUMP_FORBID_ENGINE"  # tests/conftest.py's guard (hsdump.capture.base.FORBID_ENV)


def clean_env(env: Optional[Dict[str, str]] = None, fault: Optional[str] = None) -> Dict[str, str]:
    """os.environ without hsdump's fault switch and the hub/Ray/pytest variables, plus `env`
    and, when given, HSDUMP_FAULT=fault (hsdump.store.files.fault)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(_DROP)}
    e.update(env or {})
    if fault:
        e["HSDUMP_FAULT"] = fault
    return e


def run(cmd, *, cwd, env, timeout, wait, new_session=False, split=False):
    """`cmd` (any program) with exactly `env`; (rc, output), (rc, out, err) if `split`, or the
    running process if not `wait`. The other helpers call this."""
    p = subprocess.Popen(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if split else subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=new_session,
    )
    if not wait:
        return p
    rc, out, err = _finish(p, cmd, timeout)
    return (rc, out, err) if split else (rc, out)


def _finish(p, cmd, timeout):
    """Wait for `p` at most `timeout` s: (rc, out, err); a timeout kills it and fails the test."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"timed out after {timeout} s: {cmd}\n{out[-4000:]}") from None
    return p.returncode, out, err


# --------------------------------------------------------------------------- the fork server
FORK_ENV = "HSDUMP_TEST_FORK"
"""HSDUMP_TEST_FORK=0: every run a plain subprocess (tests/zygote.py not used)."""


class Forked:
    """A run forked by the server: what the tests use of subprocess.Popen (pid, returncode,
    poll, wait, communicate, kill, terminate, send_signal). Its output is a file, read when it
    has exited; `communicate` returns (stdout + stderr, None), or (stdout, stderr) when started
    with `split`."""

    def __init__(self, server: "_Server", cmd, out: str, err: Optional[str] = None):
        self.args, self._out, self._err, self._server = cmd, out, err, server
        self.pid: int = 0
        self.returncode: Optional[int] = None
        self._done = threading.Event()

    def poll(self) -> Optional[int]:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        if self.returncode is None:
            raise AssertionError(f"the fork server died while running {self.args}")
        return self.returncode

    def communicate(self, timeout: Optional[float] = None):
        self.wait(timeout)
        texts = []
        for path in (self._out, self._err):
            if path is None:
                texts.append(None)
                continue
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
            finally:
                os.unlink(path)
        return tuple(texts)

    def send_signal(self, sig: int) -> None:
        if not self._done.is_set():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _Server:
    """tests/zygote.py, started on first use with the harness's clean environment."""

    def __init__(self, env: Dict[str, str]):
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("zygote.py"))],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.lock = threading.Lock()
        self.ids = itertools.count()
        self.pending: Dict[int, "Forked"] = {}  # request id -> run, until its pid is known
        self.running: Dict[int, "Forked"] = {}  # pid -> run
        self.forked = threading.Condition(self.lock)
        threading.Thread(target=self._read, daemon=True).start()
        atexit.register(self.close)

    def close(self) -> None:
        """At the test process's exit: the server ends (EOF) and is waited for, so its CPU time
        and its runs' count in the test process's own (time -v, getrusage)."""
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.lock:
                if "id" in msg:
                    run = self.pending.pop(msg["id"])
                    run.pid = msg["pid"]
                    self.running[run.pid] = run
                    self.forked.notify_all()
                else:
                    run = self.running.pop(msg["pid"])
                    run.returncode = msg["rc"]
                    run._done.set()
        with self.lock:  # the server is gone: nothing it ran can be waited for
            for run in [*self.pending.values(), *self.running.values()]:
                run._done.set()
            self.pending.clear()
            self.running.clear()
            self.forked.notify_all()

    def takes(self, env: Dict[str, str]) -> bool:
        return self.proc.poll() is None and same_outside_hsdump(env, self.env)

    def start(self, cmd, *, cwd, env, new_session, split=False, engine=False) -> Forked:
        paths = []
        for suffix in (".log", ".err")[: 2 if split else 1]:
            fd, path = tempfile.mkstemp(prefix="hsdump-run-", suffix=suffix)
            os.close(fd)
            paths.append(path)
        run = Forked(self, cmd, *paths)
        req = {"argv": [str(c) for c in cmd[1:]], "env": env, "cwd": str(cwd), "out": paths[0]}
        if split:
            req["err"] = paths[1]
        if engine:
            req["engine"] = True
        with self.lock:
            req["id"] = rid = next(self.ids)
            self.pending[rid] = run
            self.proc.stdin.write((json.dumps({**req, "new_session": new_session}) + "\n").encode())
            self.proc.stdin.flush()
            while rid in self.pending and self.proc.poll() is None:
                self.forked.wait(1.0)
        if not run.pid:
            raise AssertionError(f"the fork server could not start {cmd}")
        return run


CHILD_FLAGS = ("PYTHONFAULTHANDLER", "PYTHONUNBUFFERED")
"""Interpreter flags a forked child applies itself (tests/zygote.py: faulthandler on; its output
is written through unbuffered anyway), so they do not keep a run from the fork server."""


def same_outside_hsdump(a: Dict[str, str], b: Dict[str, str]) -> bool:
    """`a` and `b` differ in HSDUMP_* variables alone (hsdump reads those when it runs), or in
    the flags a forked child applies (CHILD_FLAGS)."""
    return all(
        k.startswith("HSDUMP_") or k in CHILD_FLAGS for k in set(a) | set(b) if a.get(k) != b.get(k)
    )


_servers: list = []


def fork_server() -> Optional[_Server]:
    """The server started with this process's clean environment as it is now. A test that
    imports sglang in process leaves sglang's variables (TRITON_CACHE_DIR, LD_LIBRARY_PATH,
    ...) in os.environ, as a monkeypatched variable is there for its test: a plain subprocess
    would inherit them, so runs from then on get a server started with them (one per such
    environment, kept: one started earlier may still have runs of its own going)."""
    if os.environ.get(FORK_ENV, "1") == "0":
        return None
    env = clean_env()
    for server in _servers:
        if server.proc.poll() is None and same_outside_hsdump(env, server.env):
            return server
    _servers.append(_Server(env))
    return _servers[-1]


def run_python_script(
    cmd, *, cwd, env, timeout, wait, new_session=False, split=False, engine=False
):
    """`python SCRIPT ARGS` or `python -m MODULE ARGS` (cmd[0] is this interpreter): forked by
    the server when it can take the environment, else run as `run` does; the same results.
    `engine`: the run may start SGLang, so the server imports SGLang's engine first (once)."""
    server = fork_server()
    if server is None or not server.takes(env):
        return run(
            cmd, cwd=cwd, env=env, timeout=timeout, wait=wait, new_session=new_session, split=split
        )
    p = server.start(cmd, cwd=cwd, env=env, new_session=new_session, split=split, engine=engine)
    if not wait:
        return p
    rc, out, err = _finish(p, cmd, timeout)
    return (rc, out, err) if split else (rc, out)


def _no_engine(args: Sequence, env: Dict[str, str]) -> bool:
    """A run that starts no SGLang engine, so the fork server may run it: a dry run, or any run
    of a test the engine guard keeps from starting one (tests/conftest.py: it would fail)."""
    return DRY in [str(a) for a in args] or bool(env.get(FORBID_ENV))


def python(
    *args,
    cwd: Union[str, Path] = ROOT,
    env: Optional[Dict[str, str]] = None,
    fault: Optional[str] = None,
    timeout: float = 600,
    wait: bool = True,
    new_session: bool = False,
    split: bool = False,
):
    """`python ARGS` (this interpreter) from `cwd`; `python -m hsdump ...` forked (the fork
    server) where it starts no engine. `split`: (returncode, stdout, stderr)."""
    cmd, env = [sys.executable, *args], clean_env(env, fault)
    kw = dict(cwd=cwd, env=env, timeout=timeout, wait=wait, new_session=new_session, split=split)
    if list(args[:2]) == ["-m", "hsdump"] and _no_engine(args, env):
        return run_python_script(cmd, **kw)
    return run(cmd, **kw)


def extract(
    *overrides,
    out: Optional[Union[str, Path]] = None,
    args: Sequence[str] = (),
    cwd: Union[str, Path] = ROOT,
    env: Optional[Dict[str, str]] = None,
    fault: Optional[str] = None,
    timeout: float = 600,
    wait: bool = True,
    new_session: bool = False,
    multirun: bool = False,
):
    """`python extract.py [-m] [args] [output.dir=out] progress=false OVERRIDES` (the checkout's,
    from `cwd`). `args` come first: a test's shared overrides, which OVERRIDES may override.
    `new_session`: the run leads its own process group (os.killpg kills SGLang's children too)."""
    cmd = [str(ROOT / "extract.py"), *(["-m"] if multirun else []), "progress=false", *args]
    if out is not None:
        cmd.append(f"output.dir={out}")
    env = clean_env(env, fault)
    # forked (tests/zygote.py), a real engine's run too: SGLang starts its scheduler processes
    # with multiprocessing's spawn (fresh interpreters), so the fork shares only the main
    # process's imports (torch, transformers, Hydra, hsdump: 5-9 s a run on the 2-core machine;
    # SGLang's engine module and model registry, imported by the server before the first run
    # that may start an engine: about 10 s more)
    cmd = [sys.executable, *cmd, *overrides]
    return run_python_script(
        cmd,
        cwd=cwd,
        env=env,
        timeout=timeout,
        wait=wait,
        new_session=new_session,
        engine=not _no_engine(cmd, env),
    )


def hsdump(
    *args,
    cwd: Union[str, Path, None] = None,
    env: Optional[Dict[str, str]] = None,
    timeout: float = 600,
    wait: bool = True,
    split: bool = False,
):
    """The installed console script (this environment's bin/hsdump), as a user runs it (the
    fork server runs the script where it starts no engine); `split`: (returncode, stdout,
    stderr)."""
    script, env = Path(sys.executable).parent / "hsdump", clean_env(env)
    if _no_engine(args, env):
        return run_python_script(
            [sys.executable, script, *args],
            cwd=os.getcwd() if cwd is None else cwd,
            env=env,
            timeout=timeout,
            wait=wait,
            split=split,
        )
    return run(
        [script, *args],
        cwd=cwd,
        env=env,
        timeout=timeout,
        wait=wait,
        new_session=False,
        split=split,
    )
