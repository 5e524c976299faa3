"""How the `hsdump` command names itself and where its Hydra configs are: standard library
only, so the tools' usage lines and the launchers use it without importing the CLI."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SUMMARY_ENV = "HSDUMP_SUMMARY"
"""Where `hsdump extract` writes its summary as one JSON object when it completes (a
launcher sets it: hsdump.launch.ray)."""


def config_dir() -> Path:
    """The folder holding hsdump's Hydra configs (config.yaml and the groups)."""
    here = Path(__file__).resolve().parent
    for d in (here / "conf", here.parent / "conf"):
        if (d / "config.yaml").is_file():
            return d
    raise FileNotFoundError(
        f"hsdump's configs are missing: neither {here / 'conf'} (an "
        f"installed wheel) nor {here.parent / 'conf'} (a checkout) holds "
        "config.yaml; reinstall hsdump"
    )


def prog(command: str = "") -> str:
    """How this process was called, for usage lines: `hsdump [COMMAND]` from the console
    script, `python -m hsdump [COMMAND]` from `python -m`."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "hsdump"
    base = "python -m hsdump" if name in ("__main__.py", "-c", "") else "hsdump"
    return f"{base} {command}" if command else base
