"""hsdump as an installed tool: the wheel built from this checkout, installed into a fresh
virtual environment, runs from a folder outside the checkout.

The fresh venv has no pip and no packages of its own; a .pth file puts the project venv's
site-packages after its own, so it reuses SGLang, torch and the rest without a download while
`hsdump` itself comes from the wheel (checked: its files, its configs, its console script).
The extractions run on engine=dry: what is checked is the installed command (its configs, its
Hydra runs, its sweeps, verify and export), not SGLang. The wheel holds every package and
module of the checkout's hsdump/, and each imports from the install, not from this checkout
(which the project venv's editable install would otherwise supply for a missing one).
"""

import json
import os
import shutil
import sysconfig
from pathlib import Path

import harness
import pytest
from factories import ROOT
from harness import DRY

from hsdump import __version__
from hsdump.store.reader import HsdumpDataset

SOURCES = ("pyproject.toml", "setup.py", "README.md", "requirements.txt", "hsdump", "conf")
SMALL = ["output.shard_bytes=200000", "progress=false"]  # as tests/test_pipeline.py

# Run by the fresh venv's python from outside the checkout: every module of the installed hsdump
# (its files walked, not a list) imported, each module's file and every package folder printed
# as JSON; a __main__ module is located, not run (its code is the command: run with --help).
# argv[1]: SpecForge's wheel, appended to sys.path (hsdump.online.store imports SpecForge).
IMPORT_ALL = """
import importlib, importlib.util, json, sys
from pathlib import Path
sys.path.append(sys.argv[1])
import hsdump
pkg = Path(hsdump.__file__).parent
files = {}
for f in sorted(pkg.rglob("*.py")):
    parts = ("hsdump",) + f.relative_to(pkg).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    if parts[-1] == "__main__":
        files[name] = importlib.util.find_spec(name).origin
    else:
        files[name] = importlib.import_module(name).__file__
packages = [".".join(("hsdump",) + p.parent.relative_to(pkg).parts) for p in pkg.rglob("__init__.py")]
print(json.dumps({"files": files, "packages": sorted(packages)}))
"""


def checkout_modules():
    """(module names, package names) of the checkout's hsdump/: every .py file, and every
    folder holding an __init__.py."""
    mods, pkgs = set(), set()
    for f in (ROOT / "hsdump").rglob("*.py"):
        parts = f.relative_to(ROOT).with_suffix("").parts
        mods.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        if parts[-1] == "__init__":
            pkgs.add(".".join(parts[:-1]))
    return mods, pkgs


def installed_run(bin_, name, *args, cwd, timeout=600, split=False):
    """The fresh venv's `name` (its console script `hsdump`, its `python`) with `args` from
    `cwd`, through tests/harness.py (harness.hsdump runs this environment's own script, not
    the wheel's): the harness's clean environment without PYTHONPATH and VIRTUAL_ENV, the venv
    first on PATH. Built per call, so the running test's engine guard reaches it."""
    env = harness.clean_env({"PATH": f"{bin_}{os.pathsep}{os.environ.get('PATH', '')}"})
    for k in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(k, None)
    return harness.run(
        [bin_ / name, *args],
        cwd=cwd,
        env=env,
        timeout=timeout,
        wait=True,
        new_session=False,
        split=split,
    )


def build_wheel(dest: Path) -> Path:
    """`pip wheel --no-deps` on a copy of the checkout's sources (setuptools writes build/ and
    *.egg-info next to the sources; the checkout stays clean)."""
    src = dest / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    cmd = ["-m", "pip", "wheel", "--no-deps", "-q", "-w", dest / "dist", src]
    try:
        import setuptools

        if int(setuptools.__version__.split(".")[0]) >= 64:
            cmd.insert(3, "--no-build-isolation")  # this venv's setuptools: no download
    except ImportError:
        pass
    rc, out = harness.python(*cmd, cwd=dest)
    assert rc == 0, out
    wheels = list((dest / "dist").glob("hsdump-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """hsdump's wheel, built once for the module: checked, then installed."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory, tiny_llama, wheel):
    """(venv bin folder, a work folder outside the checkout) with hsdump's wheel installed."""
    base = tmp_path_factory.mktemp("pkg")
    venv = base / "venv"
    rc, out = harness.python("-m", "venv", "--without-pip", venv, cwd=base)
    assert rc == 0, out
    rc, site = installed_run(
        venv / "bin",
        "python",
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        cwd=base,
    )
    assert rc == 0, site
    Path(site.strip(), "project-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    rc, out = harness.python(
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "install",
        "-q",
        "--no-deps",
        "--no-index",
        wheel,
        cwd=base,
    )
    assert rc == 0, out
    work = base / "elsewhere"
    work.mkdir()
    return venv / "bin", work


def test_wheel_holds_configs_templates_and_data(wheel):
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ROOT.joinpath("conf").rglob("*.yaml"):  # conf/ is copied in whole, as hsdump/conf
        assert f"hsdump/conf/{f.relative_to(ROOT / 'conf')}" in names
    assert (
        "hsdump/corpus/data/tiny_chat.jsonl" in names
        and "hsdump/corpus/templates/llama3.jinja" in names
    )
    assert f"hsdump-{__version__}.dist-info/entry_points.txt" in names


def test_wheel_holds_every_package_and_each_module_imports_from_the_install(installed):
    """The issue's "the wheel holds every subpackage": installed alone (--no-deps), every
    module the install holds imports from a folder outside the checkout, each from the fresh
    venv (a package left out of the wheel would otherwise import from this checkout through the
    project venv's editable finder), and the install holds exactly the checkout's packages and
    modules; the commands run."""
    from test_export import _peer_root

    bin_, work = installed
    venv = bin_.parent
    rc, out = installed_run(
        bin_, "python", "-c", IMPORT_ALL, _peer_root("HSDUMP_SPECFORGE_SRC"), cwd=work
    )
    assert rc == 0, out[-4000:]
    got = json.loads(out.strip().splitlines()[-1])
    mods, pkgs = checkout_modules()
    assert got["packages"] == sorted(pkgs), set(pkgs) ^ set(got["packages"])
    assert sorted(got["files"]) == sorted(mods), set(mods) ^ set(got["files"])
    assert {"hsdump.online", "hsdump.testing", "hsdump.testing.families"} <= pkgs
    away = {
        name: f
        for name, f in got["files"].items()
        if not Path(f).is_relative_to(venv) or Path(f).is_relative_to(ROOT)
    }
    assert not away, away
    for cmd in (["hsdump", "--help"], ["python", "-m", "hsdump", "--help"]):
        rc, out = installed_run(bin_, *cmd, cwd=work)
        assert rc == 0 and "\n  extract " in out, (cmd, out[-3000:])
    rc, out = installed_run(bin_, "python", "-m", "hsdump.online.consumer", "--help", cwd=work)
    assert rc == 0 and "usage: python -m hsdump.online.consumer" in out, out[-3000:]


def test_command_help_version_and_configs_outside_the_checkout(installed):
    bin_, work = installed
    rc, out = installed_run(bin_, "hsdump", "--help", cwd=work)
    assert rc == 0, out
    for cmd in ("extract", "verify", "inspect", "export", "vocab", "preview"):
        assert f"\n  {cmd} " in out, out
    rc, out = installed_run(bin_, "hsdump", "--version", cwd=work)
    assert rc == 0 and out.strip() == f"hsdump {__version__}", out
    rc, out = installed_run(bin_, "python", "-m", "hsdump", "--version", cwd=work)
    assert rc == 0 and out.strip() == f"hsdump {__version__}", out
    # the package and its configs are the wheel's, not this checkout's
    rc, out = installed_run(
        bin_,
        "python",
        "-c",
        "import hsdump, hsdump.cli as c; print(hsdump.__file__); print(c.config_dir())",
        cwd=work,
    )
    assert rc == 0, out
    pkg, conf = out.split()
    assert str(bin_.parent) in pkg and not pkg.startswith(str(ROOT)), pkg
    assert conf == str(Path(pkg).parent / "conf"), conf
    rc, out = installed_run(
        bin_,
        "hsdump",
        "extract",
        "--cfg",
        "job",
        "model=qwen3_8b",
        "dataset.max_samples=3",
        cwd=work,
    )
    assert rc == 0 and "max_samples: 3" in out and "Qwen/Qwen3-8B" in out, out
    rc, out = installed_run(
        bin_,
        "hsdump",
        "preview",
        "-n",
        "1",
        "--color",
        "never",
        "dataset.max_seq_len=64",
        cwd=work,
    )
    assert rc == 0 and "[[" in out, out[-3000:]


def test_installed_command_extracts_dry_verifies_and_export_refuses_it_unless_asked(installed):
    """The issue's done-when: from a folder outside the checkout, `hsdump extract engine=dry
    dataset.max_samples=6 output.dir=X` and `hsdump verify X` work with the installed command
    (the real engine's path is tests/test_pipeline.py's); verify notes the engine, and `hsdump
    export` refuses the dataset (its rows are no hidden states) unless --allow-dry. (One
    extraction for what were two tests, each of which extracted and verified on engine=dry.)"""
    bin_, work = installed
    rc, out = installed_run(
        bin_, "hsdump", "extract", "dataset.max_samples=6", "output.dir=X", *SMALL, DRY, cwd=work
    )
    assert rc == 0, out[-4000:]
    assert "samples written: 6" in out and "check it: hsdump verify X" in out, out[-3000:]
    assert "Ignore import error" not in out, out  # SGLang's import noise is hidden
    for stage in ("tokenize:", "engine: dry", "capture:", "commit:"):
        assert stage in out, (stage, out[-3000:])
    assert len(HsdumpDataset(str(work / "X"), allow_dry=True)) == 6
    rc, out = installed_run(bin_, "hsdump", "verify", "X", cwd=work)
    assert rc == 0 and "OK: 6 of 6 samples" in out and "engine=dry" in out, out[-3000:]
    export = ["export", "X", "E", "--to", "speculators", "--final-state", "last-layer"]
    rc, out, err = installed_run(bin_, "hsdump", *export, cwd=work, split=True)
    assert rc == 2 and "engine=dry" in err and "--allow-dry" in err, (out, err)
    assert not (work / "E").exists() or not any((work / "E").iterdir())  # nothing written
    rc, out = installed_run(bin_, "hsdump", *export, "--allow-dry", "--no-progress", cwd=work)
    assert rc == 0 and "6 samples written" in out, out[-3000:]


def test_installed_command_runs_a_multirun_sweep(installed):
    bin_, work = installed
    rc, out = installed_run(
        bin_,
        "hsdump",
        "extract",
        "-m",
        "capture.layers=[1,2,3],[3,5,7]",
        "dataset.max_samples=2",
        "output.root=sweep",
        *SMALL,
        DRY,
        cwd=work,
    )
    assert rc == 0, out[-4000:]
    for layers in ([1, 2, 3], [3, 5, 7]):
        ds = HsdumpDataset(
            str(work / "sweep" / "tiny-llama" / f"layers-{'-'.join(map(str, layers))}"),
            allow_dry=True,
        )
        assert ds.layers == layers and len(ds) == 2
    assert list(work.glob("outputs/.hydra/multirun-*/0/extract.log"))  # the job is "extract"
