"""The package's layering: sglang is imported only in hsdump/capture/ (the engine, its patch
and its serving layouts), a trainer's part (hsdump/store/) imports neither sglang nor Hydra
nor datasets, no module imports from a later stage, and the imports have no cycle. Beside the
package: bench/ imports nothing of tests/; tests/ import nothing of bench/ but the acceptance
pipeline's package (`bench.acceptance`, with its public interface); and no bench script puts a
folder on sys.path but those that import that package (the repository root, so that
`python3 bench/x.py` finds `bench.acceptance`)."""

import ast
import re
from pathlib import Path

from factories import ROOT

PKG = ROOT / "hsdump"

# a module may import from its own layer and the layers before it
LAYERS = [
    {"hsdump", "hsdump.command", "hsdump.dist", "hsdump.errors", "hsdump.store"},
    {"hsdump.config", "hsdump.locate", "hsdump.tiny"},
    {"hsdump.corpus", "hsdump.capture", "hsdump.check", "hsdump.check_final"},
    {"hsdump.tools"},
    {"hsdump.pipeline", "hsdump.online"},  # online: the pipeline per epoch, and its peers
    {"hsdump.cli", "hsdump.launch", "hsdump.__main__"},
    {"hsdump.testing"},  # the tests' and benchmarks' checkpoints
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path):
    """Every module an import statement of `path` names, function-level imports included;
    hsdump has no relative imports (bench.acceptance's own, within the package, are not named)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert PKG not in path.parents, f"{path}: relative import"
                continue
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
                or m == "hsdump.errors"
                or m.startswith("hsdump.errors.")
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


def top_level_imports(path: Path):
    """The first dotted part of every module `path` imports (function-level imports too)."""
    return {m.split(".")[0] for m in imports(path)}


def script_modules(folder: str):
    """The module names a script of `folder` can import as a sibling (its .py files, folders)."""
    return {p.stem for p in (ROOT / folder).glob("*.py")} | {
        p.name for p in (ROOT / folder).iterdir() if p.is_dir() and (p / "__init__.py").exists()
    }


def acceptance(module: str) -> bool:
    return module == "bench.acceptance" or module.startswith("bench.acceptance.")


def test_bench_and_tests_import_nothing_of_each_other():
    # what the two share (test checkpoints' configs, the comparison with transformers, engine
    # settings) lives in the package; results files (bench/results/*.json) are data, and a
    # test may run a benchmark script, but not import it or read its source; the one exception
    # is the acceptance pipeline's package, which tests import as `bench.acceptance`
    bench, tests = script_modules("bench"), script_modules("tests")
    bad = []
    for folder, theirs in (("bench", tests - bench), ("tests", bench)):
        for p in sorted((ROOT / folder).rglob("*.py")):
            text = p.read_text()
            names = imports(p)
            hits = sorted({m.split(".")[0] for m in names if not acceptance(m)} & theirs)
            if folder == "tests":  # `bench.acceptance` (and below) only
                hits += sorted(m for m in names if m.split(".")[0] == "bench" and not acceptance(m))
            if hits:
                bad.append(f"{p.relative_to(ROOT)} imports {hits}")
            puts = re.search(r"sys\.path(\.insert|\.append|\[)", text)
            if folder == "bench" and puts and not any(map(acceptance, names)):
                bad.append(f"{p.relative_to(ROOT)} edits sys.path (the package is installed)")
            for line in text.splitlines():
                if '"bench"' in line and re.search(r"ast\.parse|\.read_text\(|open\(", line):
                    if ".py" in line:
                        bad.append(f"{p.relative_to(ROOT)} reads bench/'s source: {line.strip()}")
    assert not bad, "\n".join(bad)
