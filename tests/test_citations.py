"""The repository's evidence holds together: what the docs cite exists, what is recorded is cited.

- every `bench/results/...` path cited in a tracked doc (README.md, docs/, bench/, tools/) or in
  tests/ exists (a glob must match something);
- every top-level entry of bench/results/ is cited: by path in a tracked doc, or by name in a
  tracked file of tests/, bench/ or tools/ (code reads results as RESULTS / "name");
- bench/results/ holds at most 200 tracked files, none with "partial" in its path;
- no tracked .md is over 450 lines, no tracked .py over 1,000;
- every report in docs/reports/ is linked from its index, docs/reports/README.md, and every link
  there exists;
- every relative markdown link in README.md and docs/ resolves to a file or folder.

"Tracked" is `git ls-files`. The results folder's own files are records of runs, not docs: the
paths they mention are not checked. No engine, no network.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import subprocess
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "bench/results"
MAX_RESULTS_FILES = 200
MAX_MD_LINES = 450
MAX_PY_LINES = 1000

# a cited results path: the prefix, then path characters (glob characters included); stops at
# a space, a quote, a backtick, a bracket or a `<placeholder>`
CITED = re.compile(r"bench/results(?:/[\w.\-*?/]*)?")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


@lru_cache(maxsize=1)
def tracked() -> tuple[str, ...]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    # a file deleted in the work tree but not yet from the index is not there to cite
    return tuple(p for p in out.split("\0") if p and (ROOT / p).exists())


@lru_cache(maxsize=1)
def tracked_dirs() -> frozenset[str]:
    dirs = set()
    for p in tracked():
        parts = p.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return frozenset(dirs)


def text(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8", errors="replace")


def in_results(path: str) -> bool:
    return path == RESULTS or path.startswith(RESULTS + "/")


def doc_files() -> list[str]:
    """Tracked .md files that cite results: README.md, docs/, bench/ (less the results), tools/."""
    return [
        p
        for p in tracked()
        if p.endswith(".md")
        and not in_results(p)
        and (p == "README.md" or p.split("/")[0] in ("docs", "bench", "tools"))
    ]


def code_files() -> list[str]:
    """Tracked files of tests/, bench/ (less the results) and tools/ that are not docs."""
    return [
        p
        for p in tracked()
        if p.split("/")[0] in ("tests", "bench", "tools")
        and not in_results(p)
        and not p.endswith(".md")
        and p.rsplit(".", 1)[-1] in ("py", "sh", "txt", "yaml", "yml", "toml", "json", "cfg")
    ]


def cited_paths(source: str) -> list[str]:
    """The bench/results paths cited in `source`'s text, trailing punctuation and slashes cut.

    A path qualified by a commit (`1ee8ff1:bench/results/...`, as `git show` takes it) names
    history, not the tree, and is left out; a placeholder component in capitals (`NAME`, `OUT`)
    ends the path there."""
    found = []
    for m in CITED.finditer(source):
        if re.search(r"\b[0-9a-f]{7,40}:$", source[max(0, m.start() - 41) : m.start()]):
            continue
        parts = m.group(0).split("/")
        for i, part in enumerate(parts[2:], start=2):
            if re.fullmatch(r"[A-Z][A-Z0-9_]*", part):
                parts = parts[:i]
                break
        found.append("/".join(parts).rstrip(".-/"))
    return found


def path_exists(path: str) -> bool:
    """A tracked file or folder; a glob must match a tracked file or folder."""
    if any(c in path for c in "*?"):
        return any(fnmatch.fnmatchcase(p, path) for p in tracked()) or any(
            fnmatch.fnmatchcase(d, path) for d in tracked_dirs()
        )
    return path in tracked() or path in tracked_dirs()


def results_entries() -> list[str]:
    """Top-level names under bench/results/ (a file, or the folder a file is in)."""
    return sorted({p.split("/")[2] for p in tracked() if p.startswith(RESULTS + "/")})


def missing_citations() -> list[str]:
    missing = []
    for src in doc_files() + [p for p in tracked() if p.startswith("tests/")]:
        for path in cited_paths(text(src)):
            if not path_exists(path):
                missing.append(f"{src}: {path}")
    return sorted(set(missing))


def uncited_entries() -> list[str]:
    cited = set()
    entries = results_entries()
    for src in doc_files() + code_files():
        body = text(src)
        for path in cited_paths(body):
            parts = path.split("/")
            # a glob cites what it matches only when it names something (`families-*.json`,
            # not `*.json`: a test reading every results file cites none of them)
            if len(parts) > 2 and len(re.split(r"[*?]", parts[2])[0]) >= 3:
                cited.update(e for e in entries if fnmatch.fnmatchcase(e, parts[2]))
        if src in code_files():
            for e in entries:
                # the bare name, not inside a longer one (cpu.json in families-cpu.json, a
                # folder's name before `-5ep` or `.json`)
                if re.search(rf"(?<![\w.\-]){re.escape(e)}(?![\w\-]|\.\w)", body):
                    cited.add(e)
    return [e for e in entries if e not in cited]


def results_files() -> list[str]:
    return [p for p in tracked() if p.startswith(RESULTS + "/")]


def line_count(path: str) -> int:
    return len(text(path).splitlines())


def links(path: str) -> list[str]:
    """Relative link targets of a markdown file, outside code, less anchors."""
    body = INLINE_CODE.sub("", FENCE.sub("", text(path)))
    out = []
    for target in LINK.findall(body):
        if re.match(r"^[a-z][a-z0-9+.\-]*:", target, re.I) or target.startswith("#"):
            continue
        target = target.split("#", 1)[0]
        if target:
            out.append(target)
    return out


def normalise(src: str, target: str) -> str:
    """`target`, linked from `src`, as a path from the repository root ('..' first: outside)."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(src), target))


def resolves(src: str, target: str) -> bool:
    rel = normalise(src, target)
    return rel in tracked() or rel in tracked_dirs() or rel == "."


# --- the checks ---------------------------------------------------------------------------------


def test_every_cited_results_path_exists():
    missing = missing_citations()
    assert not missing, "cited but not in bench/results:\n" + "\n".join(missing)


def test_every_results_entry_is_cited():
    uncited = uncited_entries()
    assert not uncited, (
        "bench/results entries no doc, test, bench or tools file cites (cite it by path in its "
        "report, or remove it):\n" + "\n".join(uncited)
    )


def test_results_folder_size_and_no_partial_runs():
    files = results_files()
    partial = [p for p in files if "partial" in p.lower()]
    problems = (
        [f"{len(files)} tracked files in bench/results"] if len(files) > MAX_RESULTS_FILES else []
    )
    problems += [f"a partial run: {p}" for p in partial]
    assert not problems, "\n".join(problems)


def test_no_markdown_file_over_450_lines():
    long = [
        f"{p}: {n}" for p in tracked() if p.endswith(".md") if (n := line_count(p)) > MAX_MD_LINES
    ]
    assert not long, "markdown files over 450 lines:\n" + "\n".join(long)


def test_no_python_file_over_1000_lines():
    long = [
        f"{p}: {n}" for p in tracked() if p.endswith(".py") if (n := line_count(p)) > MAX_PY_LINES
    ]
    assert not long, "Python files over 1,000 lines:\n" + "\n".join(long)


def test_every_report_is_in_the_index():
    index = "docs/reports/README.md"
    assert index in tracked(), "docs/reports/README.md is missing"
    reports = {p for p in tracked() if p.startswith("docs/reports/") and p.endswith(".md")}
    reports.discard(index)
    targets = links(index)
    linked = {normalise(index, t) for t in targets}
    problems = [f"not in the index: {p}" for p in sorted(reports - linked)]
    problems += [f"the index links to nothing: {t}" for t in targets if not resolves(index, t)]
    assert not problems, "\n".join(problems)


def test_relative_links_in_readme_and_docs_resolve():
    sources = [
        p for p in tracked() if p.endswith(".md") and (p == "README.md" or p.startswith("docs/"))
    ]
    broken = [f"{src}: {t}" for src in sources for t in links(src) if not resolves(src, t)]
    assert not broken, "links to nothing:\n" + "\n".join(broken)
