"""How long `make setup`'s install of requirements.lock takes: pip against uv, from empty caches.

    python3 bench/setup_time.py [--out results.json] [--work DIR]

Makes a new venv for each way, in turn, with its own empty download cache under DIR (a temporary
folder by default; each venv is about 11 GB and is deleted before the next), and times:
- `pip`: `pip install -r requirements.lock` (what `make setup` did before uv);
- `uv`: pip installs uv (requirements-setup.txt), then `uv pip install -r requirements.lock`
  (bytecode left to be compiled at import);
- `uv+bytecode`: the same with `--compile-bytecode`, every module compiled at install as pip
  does: what `make setup` runs (the Makefile says why).
Prints a table of the three, side by side, and whether each venv's `pip freeze` (less uv itself)
is the same package set. Standard library only; needs the package registry and about 14 GB free.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK, SETUP = ROOT / "requirements.lock", ROOT / "requirements-setup.txt"


def sh(cmd, env=None):
    p = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stderr[-3000:]}")
    return p.stdout


def install(way: str, work: Path) -> dict:
    venv, cache = work / f"venv-{way}", work / f"cache-{way}"
    shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    sh([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    env = dict(os.environ, PIP_CACHE_DIR=str(cache / "pip"), UV_CACHE_DIR=str(cache / "uv"))
    t0 = time.monotonic()
    if way == "pip":
        sh([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", LOCK], env)
    else:
        sh([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", SETUP], env)
        extra = ["--compile-bytecode"] if way == "uv+bytecode" else []
        sh([venv / "bin" / "uv", "pip", "install", "--python", py, "-q", *extra, "-r", LOCK], env)
    seconds = time.monotonic() - t0
    freeze = sh([py, "-m", "pip", "freeze", "--disable-pip-version-check"]).split()
    shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return {
        "seconds": round(seconds, 1),
        "packages": sorted(p for p in freeze if not p.startswith("uv==")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    ap.add_argument("--work", type=Path, help="folder for the venvs and caches (a temp folder)")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="hsdump-setup-time-"))
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free / 1e9
    if free < 14:
        sys.exit(f"{free:.1f} GB free under {work}: this needs about 14 GB (one venv at a time)")
    runs = {way: install(way, work) for way in ("pip", "uv", "uv+bytecode")}
    same = {way: r["packages"] == runs["pip"]["packages"] for way, r in runs.items()}
    print(f"{'way':<14}{'seconds':>9}{'x pip':>8}  same packages as pip")
    for way, r in runs.items():
        ratio = runs["pip"]["seconds"] / r["seconds"]
        print(f"{way:<14}{r['seconds']:>9.1f}{ratio:>8.2f}  {same[way]}")
    if a.out:
        a.out.write_text(json.dumps({
            "what": "requirements.lock installed into a new venv, empty download cache each",
            "python": sys.version.split()[0], "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "seconds": {w: r["seconds"] for w, r in runs.items()}, "same_packages": same,
            "packages": len(runs["pip"]["packages"]),
        }, indent=1) + "\n")  # fmt: skip
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
