"""The `hsdump` command (console script `hsdump`, also `python -m hsdump`).

    hsdump extract [OVERRIDES...]    capture hidden states: the Hydra app of extract.py
    hsdump verify|check|inspect|export|vocab|preview ARGS...
    hsdump --version

`extract` takes every override `python extract.py` takes (`-m` for sweeps and launchers,
`--cfg job`, `--help`). Its configs are `hsdump/conf` inside an installed wheel (a copy of the
checkout's top-level `conf/`, made when the wheel is built), else the checkout's `conf/`
(editable installs, running from the source tree): see `config_dir`.

Import-safe and light: importing this module imports nothing outside the standard library,
so `hsdump --help` is quick, and SGLang's spawned processes, which re-import the main module
(the console script or extract.py), do no work in it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import List, Optional

from hsdump import __version__
from hsdump.command import SUMMARY_ENV, config_dir, prog
from hsdump.errors import hydra_usage_error

log = logging.getLogger("hsdump")


COMMANDS = {
    "extract": ("", "capture hidden states into a dataset (Hydra overrides, -m for sweeps)"),
    "verify": ("hsdump.tools.verify", "check a dataset's index, checksums and every sample"),
    "check": ("hsdump.tools.check", "compare a few samples' rows with transformers"),
    "compact": ("hsdump.store.commits", "rewrite a dataset's index.json from its commit logs"),
    "inspect": ("hsdump.tools.inspect", "print a dataset's facts and plot its length histograms"),
    "export": ("hsdump.tools.export", "convert a dataset to a peer trainer's layout"),
    "vocab": ("hsdump.tools.vocab", "write the EAGLE-3 draft vocabulary mapping (d2t, t2d)"),
    "preview": ("hsdump.tools.preview", "show rendered samples with the loss-masked tokens marked"),
    "ray": ("hsdump.launch.ray", "run N extraction jobs as Ray tasks, one dataset"),
}


def usage() -> str:
    lines = [
        f"usage: {prog()} COMMAND [args]   ({prog()} COMMAND --help for each)",
        "",
        "commands:",
    ]
    lines += [f"  {name:8s} {doc}" for name, (_, doc) in COMMANDS.items()]
    lines += [
        "",
        "options:",
        "  --version  print hsdump's version",
        "  -h, --help show this",
        "",
        f"e.g. {prog()} extract dataset.max_samples=6 output.dir=out/tiny",
        f"     {prog()} verify out/tiny",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- extract
def extract_job(cfg) -> None:
    """One extraction with a composed config: the task function of both entry points
    (extract.py and `hsdump extract`). Module-level, so launchers can pickle it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from hsdump.config import to_config
    from hsdump.errors import Refusal
    from hsdump.pipeline import Interrupted, output_error, run
    from hsdump.store.writer import WriteError

    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:  # an override's ${...} that does not resolve: usage
        log.error("%s", e)
        sys.exit(2)
    try:
        if (cfg.get("online") or {}).get("folder"):  # train while capturing: hsdump.online
            from hsdump.online.producer import run as run_online

            print(json.dumps(run_online(to_config(cfg), resolved_config=resolved)))
            return
        summary = run(to_config(cfg), resolved_config=resolved)
    except Interrupted as e:
        log.error("%s", e)
        sys.exit(3)
    except Refusal as e:  # bad input, and only that: the message names the fix
        log.error("%s", e)
        sys.exit(2)
    except (WriteError, OSError) as e:  # the disk under output.dir: full, read-only, gone
        if not isinstance(e, WriteError) and not about_output(e, cfg.output.dir):
            raise  # another file's: an error with its traceback (exit 1), not bad input
        log.error("%s", output_error(e, cfg.output.dir))
        sys.exit(2)
    for line in summary.lines():
        print(line)
    if os.environ.get(SUMMARY_ENV):  # a launcher's machine-readable copy (hsdump.launch.ray)
        Path(os.environ[SUMMARY_ENV]).write_text(json.dumps(summary.to_dict()) + "\n")


def about_output(e: OSError, out_dir: str) -> bool:
    """An OSError of the output folder: a file inside output.dir or a folder above it (one
    that could not be made), or, without a file name, the disk itself (full, over quota,
    read-only, failing)."""
    import errno

    name = getattr(e, "filename", None)
    if not name:
        return e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)
    name, out = os.path.abspath(str(name)), os.path.abspath(str(out_dir))
    return os.path.commonpath([name, out]) in (name, out)


def run_app(app) -> None:
    """Run a `hydra.main` app (extract.py's, `hsdump extract`'s) with docs/errors.md's exit
    statuses: Hydra's own usage errors (it prints them and exits 1) exit 2, as extract's own
    refusals do; an unexpected error inside the task keeps Hydra's 1 and its traceback."""
    try:
        app()
    except SystemExit as e:
        # Hydra's run_and_report calls sys.exit(1) while handling the error: its context
        if e.code == 1 and hydra_usage_error(e.__context__):
            raise SystemExit(2) from None
        raise
    except Exception as e:  # HYDRA_FULL_ERROR=1: Hydra re-raises instead of exiting
        if not hydra_usage_error(e):
            raise
        import traceback

        traceback.print_exc()
        raise SystemExit(2) from None


def _record(mode, run_dir, value):
    """conf/config.yaml's `hsdump_record` resolver: Hydra's record of a single run (its
    .hydra folder, its log file) is kept only where hydra.run.dir is set; by default (`.`)
    there is none (the log file is os.devnull), so a run leaves nothing in the current
    folder. Sweeps keep theirs."""
    # hydra.mode resolves to the enum RunMode.MULTIRUN (str: "RunMode.MULTIRUN") or its name
    if str(getattr(mode, "name", mode)).endswith("MULTIRUN") or str(run_dir) != ".":
        return value
    return None if value == ".hydra" else os.devnull


def register_resolvers() -> None:
    """Resolvers conf/config.yaml uses (call before Hydra composes the config)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("hsdump_record"):
        OmegaConf.register_new_resolver("hsdump_record", _record)


def extract(argv: List[str]) -> int:
    """`hsdump extract OVERRIDES...`: Hydra parses them from sys.argv, as for extract.py."""
    import hydra

    from hsdump.config import register_configs

    register_configs()
    register_resolvers()
    # the job is "extract", as for extract.py (Hydra names it after the task's file or module;
    # it names the run's log file); last, since argparse wants the overrides after the options
    if not any(a.startswith(("hydra.job.name=", "--info")) for a in argv):
        argv = [*argv, "hydra.job.name=extract"]
    saved = sys.argv
    sys.argv = [f"{prog()} extract", *argv]
    try:
        run_app(
            hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(
                extract_job
            )
        )
    finally:
        sys.argv = saved
    return 0


# --------------------------------------------------------------------------- main
def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"hsdump {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if name == "extract":
        return extract(rest)
    import warnings

    # a tool's warnings (a damaged record left out, an index.json ignored) as one line each
    warnings.formatwarning = lambda message, *a, **k: f"{prog(name)}: warning: {message}\n"
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as e:
        if e.name == COMMANDS[name][0]:
            print(f"`{name}` is not available in this version of hsdump", file=sys.stderr)
            return 2
        raise
    return int(module.main(rest) or 0)


def finish(fn, *args) -> None:
    """Run a command's entry function and end the process with its exit status, without the
    interpreter's own teardown: the exit handlers run (atexit: multiprocessing's children,
    logging, the libraries' own) and the streams are flushed, but the final garbage collection
    of every module (torch's and SGLang's bindings: 5 s after a CPU extraction, 0.1 s without
    it, measured 2026-12-03) is skipped. Everything the command writes is committed before its
    function returns; an unexpected error still ends through Python's own path (traceback)."""
    try:
        code = fn(*args)
    except SystemExit as e:
        code = e.code
    if code is None:
        rc = 0
    elif isinstance(code, int):
        rc = code
    else:  # sys.exit("message"), as Python does it: the message on stderr, status 1
        print(code, file=sys.stderr)
        rc = 1
    import atexit

    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(rc)


def console() -> None:
    """The console script's entry point."""
    finish(main)


if __name__ == "__main__":
    finish(main)
