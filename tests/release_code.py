"""A SGLang release's own functions and classes, run from its source files without importing
its package (SGLang 0.5.17 cannot be imported beside the venv's 0.5.23; tests/setters.py reads
its setters the same way, as text).

`load(path, links)` executes a module's top-level definitions one by one in a fresh namespace,
under the module's own `from __future__ import annotations`: imports of other packages run as
written; names imported from `sglang` or `sgl_kernel` are what `links` gives (another module
loaded this way, or a stand-in), else a `Missing` that raises when used; module-level `if` and
`try` blocks (platform probes) are skipped, and so is a definition that cannot be made without
what is missing (a class whose base is `Missing`): `skipped` lists them. What a test calls runs
the release's code as released, and fails loudly if it reaches anything not loaded.
"""

from __future__ import annotations
import __future__

import ast
import os
import re
import sys
import types
from pathlib import Path

OWN = ("sglang", "sgl_kernel")


class Missing:
    """A name the loaded module imports from SGLang that was not linked."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, k):
        raise RuntimeError(f"{self._name}.{k}: not loaded (tests/release_code.py links)")

    def __call__(self, *a, **k):
        raise RuntimeError(f"{self._name}: not loaded (tests/release_code.py links)")

    def __mro_entries__(self, bases):
        raise TypeError(f"{self._name}: a base class that is not loaded")


def load(path: Path, links: dict | None = None) -> dict:
    path = Path(path)
    links = links or {}
    text = path.read_text(encoding="utf-8-sig")
    # a module object in sys.modules (dataclasses look their class's module up there)
    mod = types.ModuleType(f"release_code.{path.parent.name}.{path.stem}.{abs(hash(str(path)))}")
    mod.__file__ = str(path)
    sys.modules[mod.__name__] = mod
    ns = mod.__dict__
    ns["skipped"] = []
    flags = __future__.annotations.compiler_flag
    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(OWN)):
            for a in node.names:
                name = a.asname or a.name
                ns[name] = links.get(name, Missing(f"{node.module}.{a.name}"))
            continue
        if isinstance(node, ast.Import) and any(a.name.startswith(OWN) for a in node.names):
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                ns[name] = links.get(name, Missing(a.name))
            continue
        if isinstance(node, (ast.If, ast.Try)):
            continue
        code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec", flags, True)
        try:
            exec(code, ns)
        except Exception as e:  # noqa: BLE001 - what cannot be defined without SGLang
            ns["skipped"].append((getattr(node, "name", type(node).__name__), repr(e)))
    return ns


class Envs:
    """SGLang's `envs` registry for the variables a loaded module reads: each one's value from
    the environment, else its default as the release's own environ.py declares it
    (`NAME = EnvStr("default")`)."""

    def __init__(self, environ_py: Path):
        self._text = Path(environ_py).read_text(encoding="utf-8-sig")

    def __getattr__(self, name):
        m = re.search(rf"^\s*{name}\s*=\s*Env\w+\(\s*['\"]([^'\"]*)['\"]", self._text, re.M)
        if m is None:
            raise AttributeError(f"{name}: not declared with a string default in environ.py")
        default = m.group(1)

        class _Var:
            def get(self):
                return os.environ.get(name, default)

        return _Var()


def dspark(root: Path) -> dict:
    """SGLang's DSpark config reader and head builders from the release under `root` (its
    `sglang/srt`): parse_dflash_draft_config, parse_dspark_draft_config, build_markov_head,
    build_confidence_head, with the ragged-verify mode read as that release reads it."""
    root = Path(root)
    du = load(root / "speculative" / "dflash_utils.py")
    rv = load(root / "speculative" / "ragged_verify.py", {"envs": Envs(root / "environ.py")})
    dc = load(root / "speculative" / "dspark_components" / "dspark_config.py",
              {"parse_dflash_draft_config": du["parse_dflash_draft_config"]})  # fmt: skip
    dm = load(root / "models" / "dspark.py", {
        "parse_dspark_draft_config": dc["parse_dspark_draft_config"],
        "read_ragged_verify_mode": rv["read_ragged_verify_mode"],
        "RaggedVerifyMode": rv["RaggedVerifyMode"],
        "envs": Envs(root / "environ.py"),
    })  # fmt: skip
    return {
        "parse_dflash_draft_config": du["parse_dflash_draft_config"],
        "parse_dspark_draft_config": dc["parse_dspark_draft_config"],
        "build_markov_head": dm["build_markov_head"],
        "build_confidence_head": dm["build_confidence_head"],
    }
