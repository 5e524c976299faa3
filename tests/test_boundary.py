"""Only hsdump/engine.py may import sglang; the reader imports neither sglang nor Hydra."""

import ast
from pathlib import Path

from factories import ROOT

PKG = ROOT / "hsdump"


def imported_modules(path: Path):
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module.split(".")[0])
    return mods


def test_only_engine_imports_sglang():
    users = sorted(p.name for p in PKG.rglob("*.py") if "sglang" in imported_modules(p))
    assert users == ["engine.py"]


def test_reader_is_standalone():
    mods = imported_modules(PKG / "reader.py")
    assert not mods & {"sglang", "hydra", "omegaconf", "datasets"}
