"""SGLang's drafter-kind setters read from a release's model sources, without importing them
(SGLang 0.5.17 cannot be imported beside the venv's 0.5.23): for an architecture, the class
that owns `set_{kind}_layers_to_capture` (the architecture's class, else its first base's, each
looked up in its own file first) and its shift: `plus1` (`val + 1 for`), `first_id_1` (the first
id tested against 1), `none`; `-> delegates` where it calls its language model's setter."""

import ast
import re
from pathlib import Path

KINDS = ("eagle3", "dflash", "dspark")


def _text(p: Path) -> str:
    return p.read_text(encoding="utf-8-sig")  # some of SGLang's files open with a BOM


def classes(models: Path) -> dict:
    """Every top-level class of the model files: name -> [(file, its text, its node)]."""
    out = {}
    for p in sorted(models.glob("*.py")):
        text = _text(p)
        for n in ast.parse(text).body:
            if isinstance(n, ast.ClassDef):
                out.setdefault(n.name, []).append((p, text, n))
    return out


def entry_file(models: Path, arch: str):
    """The file SGLang registers `arch` from (its EntryClass names it), where several define
    it; None where none does."""
    hits = [
        p for p in sorted(models.glob("*.py")) if re.search(rf"^class {arch}\(", _text(p), re.M)
    ]
    entry = rf"^EntryClass\s*=[^=]*?\b{arch}\b"
    hits.sort(key=lambda p: not re.search(entry, _text(p), re.M | re.S))
    return hits[0] if hits else None


def read_setters(models: Path, arch: str, by_name=None) -> dict:
    """{kind: [owner, shift]} for the kinds `arch` has a setter for."""
    by_name = by_name if by_name is not None else classes(models)
    where = entry_file(models, arch)
    assert where is not None, f"no class {arch} in {models}"

    def find(name, path):
        found = sorted(by_name.get(name, []), key=lambda c: c[0] != path)
        return found[0] if found else None

    got = {}
    for kind in KINDS:
        name = f"set_{kind}_layers_to_capture"
        found, src, owner = find(arch, where), None, None
        while found is not None and src is None:
            path, text, node = found
            defs = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == name]
            if defs:
                src, owner = ast.get_source_segment(text, defs[0]), node.name
            else:
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                found = find(bases[0], path) if bases else None
        if src is None:
            continue
        if "language_model.set_" in src:
            owner += " -> delegates"
        shift = "first_id_1" if "[0] == 1" in src else "plus1" if "+ 1 for" in src else "none"
        got[kind] = [owner, shift]
    return got
