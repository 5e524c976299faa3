"""The fork server of tests/harness.py: `python tests/zygote.py`, started once per test process.

It imports what every dry `extract.py` run imports (torch, transformers' AutoTokenizer,
datasets, Hydra, hsdump's pipeline: about 6 s of CPU a run on the 2-core machine) and loads the
default model's tokenizer (`preload_tokenizer`: served only where the folder's files are the
bytes it was loaded from), then forks one child per request. Each child is a fresh process in every other respect: it takes the
request's argv, environment, working directory and output file (stdout and stderr, stdin
/dev/null), runs the script as `__main__` (runpy, as `python SCRIPT ARGS` does) and exits with
the status `python` would give (SystemExit's code, 1 and the traceback for an error, killed by
the signal that killed it). The harness uses it only for runs whose environment differs from
the one this server started with in HSDUMP_* variables alone (hsdump reads those when it runs,
not when it is imported), so what the imports saw is what the run would have seen, and in
PYTHONFAULTHANDLER (the child enables faulthandler) and PYTHONUNBUFFERED (its output is written
through anyway). A real engine's run finds SGLang's engine imported (`preload_engine`);
SGLang's scheduler processes are spawned (fresh interpreters), not forked from it.

Protocol: one JSON object a line. In (stdin): {"id", "argv", "env", "cwd", "out",
"new_session"} and optionally "err" (stderr's own file) and "engine" (true: the run may start
SGLang, so the server imports SGLang's engine first, once: `preload_engine`); argv[0] "-m" runs argv[1] as a module. Out (the stdout it started with): {"id", "pid"} when a child is forked,
{"pid", "rc"} when it has exited (rc as subprocess.Popen.returncode: -N for signal N).
EOF on stdin: the test process is gone; the server exits (its children run on).
"""

from __future__ import annotations

import io
import json
import os
import select
import sys


def preload() -> None:
    import datasets  # noqa: F401
    import hydra  # noqa: F401
    import omegaconf  # noqa: F401
    import torch  # noqa: F401
    import tqdm  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401  (the lazy module's import happens here)

    import hsdump.capture.dry  # noqa: F401
    import hsdump.cli  # noqa: F401
    import hsdump.config  # noqa: F401
    import hsdump.pipeline  # noqa: F401
    import hsdump.store.reader  # noqa: F401
    from hsdump.tiny import resolve_model_path

    preload_tokenizer(resolve_model_path("tiny:llama"))
    # submitit waits up to 15 s for the result file of a job that died without one (its grace
    # for network filesystems that show files late); a killed local job's folder here is on the
    # local disk, where the file is there or never comes. The launcher tests kill jobs on
    # purpose: 2 s keeps the grace and spends 13 s less a killed job.
    import submitit.core.core

    submitit.core.core.Job._results_timeout_s = 2


STARTED_ENV = dict(os.environ)
IMPORT_ENV: dict = {"base": {}, "engine": {}}
"""{name: (before, after)} for each variable that this server's imports set or changed in
os.environ (before None: unset): "base", `preload`'s (torch's TORCHINDUCTOR_CACHE_DIR), for
every child; "engine", `preload_engine`'s (SGLang's CUDA_CACHE_PATH, TRITON_CACHE_DIR, ...), for
a child that may start an engine. A child whose own value is `before` gets `after`, as the same
imports would have done in a fresh interpreter."""
_ENGINE = []


def note_import_env(part: str) -> None:
    seen = {k: v for d in IMPORT_ENV.values() for k, (_, v) in d.items()}
    IMPORT_ENV[part] = {
        k: (STARTED_ENV.get(k), v)
        for k, v in os.environ.items()
        if STARTED_ENV.get(k) != v and seen.get(k) != v
    }


def preload_engine() -> None:
    """SGLang's engine module and model registry, and hsdump's engine (about 10 s of CPU on the
    2-core machine; every run that starts an engine imports them in its main process), imported
    once, before the first request that may start an engine (`"engine": true`) is forked, so a
    test tier that starts none never pays for it. The import starts no thread, no process and
    installs no signal handler (checked on SGLang 0.5.23); the loggers it makes are kept by the
    run's logging set-up (Hydra's, `disable_existing_loggers: false`). If it fails, the children
    import for themselves, as they did before."""
    if _ENGINE:
        return
    _ENGINE.append(True)
    try:
        import sglang.srt.entrypoints.engine  # noqa: F401
        import sglang.srt.models.registry  # noqa: F401

        import hsdump.capture.engine  # noqa: F401
    except Exception as e:  # noqa: BLE001 (the children's own import will say what is wrong)
        print(f"zygote: SGLang's engine not preloaded: {e!r}", file=sys.stderr)
    note_import_env("engine")


WEIGHTS = (".safetensors", ".bin", ".pt", ".gguf")


def folder_digest(folder: str) -> dict:
    """{name: sha256} of every file in `folder` but the weights: all a tokenizer load reads."""
    from hsdump.store.layout import sha256_file

    return {
        name: sha256_file(os.path.join(folder, name))
        for name in sorted(os.listdir(folder))
        if not name.endswith(WEIGHTS) and os.path.isfile(os.path.join(folder, name))
    }


def preload_tokenizer(folder: str) -> None:
    """The default model's tokenizer (tiny:llama's folder: DeepSeek-V3's 129K tokens, ~2 s of
    CPU a load), loaded once here. A child's first `AutoTokenizer.from_pretrained` of that
    folder, with no other arguments than trust_remote_code=False, gets this tokenizer when
    every file of the folder but the weights still has the bytes it was loaded from (checked
    in the child, per call); any other load, and a second one in the same child (the run may
    have changed the first: its chat_template), is transformers' own."""
    from transformers import AutoTokenizer

    folder = os.path.realpath(folder)
    digest = folder_digest(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    real = AutoTokenizer.from_pretrained
    served = []

    def from_pretrained(source, *args, **kwargs):
        if (
            not served
            and not args
            and kwargs in ({}, {"trust_remote_code": False})
            and isinstance(source, (str, os.PathLike))
            and os.path.isdir(source)
            and os.path.realpath(source) == folder
            and folder_digest(folder) == digest
        ):
            served.append(source)
            return tok
        return real(source, *args, **kwargs)

    AutoTokenizer.from_pretrained = from_pretrained


def child(req: dict, proto_out: int) -> None:
    """In the forked child: become the requested `python ARGV` run; never returns."""
    import atexit
    import runpy
    import signal
    import threading
    import traceback

    code = 1
    try:
        os.close(proto_out)
        if req["new_session"]:
            os.setsid()
        out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        if req.get("err"):  # stderr to a file of its own (the harness's `split`)
            err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(err, 2)
            os.close(err)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        enc = {"encoding": "utf-8", "write_through": True}
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), **enc)
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), errors="backslashreplace", **enc
        )
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for part in ("base", "engine") if req.get("engine") else ("base",):
            for k, (was, now) in IMPORT_ENV[part].items():  # as the imports would have set them
                if os.environ.get(k) == was:
                    os.environ[k] = now
        if os.environ.get("PYTHONFAULTHANDLER"):  # as `python` does with the variable set
            import faulthandler

            faulthandler.enable()
        argv = list(req["argv"])
        try:
            if argv[0] == "-m":  # `python -m MODULE ARGS`: the module as __main__, cwd on the path
                sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in argv[0]
                sys.path[0] = os.getcwd()
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = argv
                sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
                runpy.run_path(sys.argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:  # as python does: die of SIGINT
            traceback.print_exc()
            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()  # as the interpreter's exit: non-daemon threads, then atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # before the output file was in place: say so where it can
        traceback.print_exc()
    finally:
        os._exit(code & 0xFF)


def main() -> None:
    preload()
    note_import_env("base")
    proto_out = os.dup(1)
    os.dup2(2, 1)  # stray prints of the server go to its stderr, never into the protocol

    def send(msg: dict) -> None:
        os.write(proto_out, (json.dumps(msg) + "\n").encode())

    children = set()
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.02 if children else 0.5)
        if ready:
            data = os.read(0, 1 << 16)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                if req.get("engine"):
                    preload_engine()
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    child(req, proto_out)
                children.add(pid)
                send({"id": req["id"], "pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                send({"pid": pid, "rc": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
