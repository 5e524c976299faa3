"""The package's layering: sglang is imported only in hsdump/capture/ (the engine, its patch
and its serving layouts), a trainer's part (hsdump/store/) imports neither sglang nor Hydra
nor datasets, no module imports from a later stage, and the imports have no cycle."""

import ast
from pathlib import Path

from factories import ROOT

PKG = ROOT / "hsdump"

# a module may import from its own layer and the layers before it
LAYERS = [
    {"hsdump", "hsdump.command", "hsdump.dist", "hsdump.store"},
    {"hsdump.config", "hsdump.locate", "hsdump.tiny"},
    {"hsdump.corpus", "hsdump.capture"},
    {"hsdump.tools"},
    {"hsdump.pipeline"},
    {"hsdump.cli", "hsdump.launch", "hsdump.__main__"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path):
    """Every module an import statement of `path` names (absolute imports only: hsdump has no
    relative ones), function-level imports included."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def layer_of(mod: str) -> int:
    for i, group in enumerate(LAYERS):
        for g in group:
            if mod == g or (g != "hsdump" and mod.startswith(g + ".")):
                return i
    return 0 if mod == "hsdump" else -1


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def test_only_capture_imports_sglang():
    users = sorted(
        str(p.relative_to(PKG))
        for p in MODULES.values()
        if any(m.split(".")[0] == "sglang" for m in imports(p))
    )
    assert users == ["capture/engine.py", "capture/patch.py", "capture/serving.py"]


def test_store_is_standalone():
    for name, p in MODULES.items():
        if name.startswith("hsdump.store"):
            top = {m.split(".")[0] for m in imports(p)}
            assert not top & {"sglang", "hydra", "omegaconf", "datasets", "transformers"}, name
            inner = {m for m in imports(p) if m.startswith("hsdump.")} - {"hsdump.__version__"}
            assert all(
                m.startswith("hsdump.store")
                or m in ("hsdump.config", "hsdump.command", "hsdump.command.prog")
                or m.startswith("hsdump.config.")
                for m in inner
            ), (name, inner)


def test_no_module_imports_a_later_stage():
    bad = []
    for name, p in MODULES.items():
        mine = layer_of(name)
        assert mine >= 0, f"{name} is in no layer of LAYERS"
        for m in imports(p):
            if m.startswith("hsdump.") and m in MODULES and layer_of(m) > mine:
                bad.append(f"{name} imports {m}")
    assert not bad, bad


def test_no_import_cycles():
    graph = {
        n: {m for m in imports(p) if m in MODULES and m != n and m != "hsdump"}
        for n, p in MODULES.items()
    }
    seen, stack = {}, []

    def visit(n):
        seen[n] = 1
        stack.append(n)
        for m in graph[n]:
            if seen.get(m) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(m) :] + [m]))
            if m not in seen:
                visit(m)
        seen[n] = 2
        stack.pop()

    for n in graph:
        if n not in seen:
            visit(n)
