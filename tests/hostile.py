"""Hostile dataset folders for tests/test_hostile.py, and the driver that opens them.

`build(root)` writes a small valid dataset (every file kind: manifest, index, two commit logs,
shards with final states and conversations, token_freq.json), a folder outside it holding a
canary, and under `root/cases/` one folder per hostile case: FIFOs, devices and links to outside
in place of each file kind, crafted numbers, and seeded random byte flips and truncations of
every file kind. `python tests/hostile.py CASES OUT.json` (run by the test in a subprocess under
a memory cap) opens every case with every tool in turn, in process, each under a time limit,
and writes what each returned, printed and raised.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import resource
import shutil
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

from factories import H, rows_manifest

CANARY = "CANARY-outside-the-dataset-7f3a"
"""Written only outside the dataset folder: no tool's output may ever hold it."""
CASE_SECONDS = 15
"""Each tool on each case: well above what a clean open takes (under a second)."""
TOOLS = ("reader", "verify", "inspect", "export", "messages", "vocab", "resume", "compact")
LAYERS = [1, 2, 3]
MANIFEST = rows_manifest(layers=LAYERS, final=["pre_norm"])


# ---------------------------------------------------------------------- the valid dataset
def _write(path: Path, tag: str, sids) -> None:
    import torch

    from hsdump.store.writer import DatasetWriter

    w = DatasetWriter(str(path), MANIFEST, shard_bytes=600, writer_tag=tag)
    for sid in sids:
        n = 3 + sid % 5
        g = torch.Generator().manual_seed(sid)
        w.add(
            sid,
            torch.randint(0, 50, (n,), generator=g).tolist(),
            [0] + [1] * (n - 1),
            [torch.randn(n, H, generator=g) for _ in LAYERS],
            {"pre_norm": torch.randn(n, H, generator=g)},
            conversation=[
                {"role": "user", "content": f"q{sid}"},
                {"role": "assistant", "content": f"a{sid}"},
            ],
        )
    w.skip(99 if tag else 98, "nonfinite in hidden_states[0]")
    w.close()


def base(path: Path) -> Path:
    """A valid dataset of two jobs' logs, index.json, shards, token_freq.json."""
    import numpy as np

    from hsdump.store.stats import _write as write_freq

    _write(path, "", [0, 1, 2, 3])
    _write(path, "j1of2", [5, 7])
    write_freq(np.array([0, 5, 3, 2], dtype=np.int64), 6, str(path), 50, "input_ids")
    return path


def shards(d: Path):
    return sorted(d.glob("shards/*/*/*.safetensors"))


# ---------------------------------------------------------------------- the cases
def _fifo(p: Path) -> None:
    p.unlink(missing_ok=True)
    os.mkfifo(p)


def _link(p: Path, target) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)
    os.symlink(target, p)


def _log_line(d: Path, rec, name: str = "main") -> None:
    with open(d / "commits" / f"{name}.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def _edit_json(p: Path, fn) -> None:
    obj = json.loads(p.read_text())
    fn(obj)
    p.write_text(json.dumps(obj))


def _header(shard: Path):
    raw = shard.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _set_header(shard: Path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    shard.write_bytes(len(text).to_bytes(8, "little") + text + data)


def _offsets(shard: Path, fn) -> None:
    header, data = _header(shard)
    key = next(k for k in header if k.endswith("/hidden_states/0"))
    header[key]["data_offsets"] = fn(*header[key]["data_offsets"], len(data))
    _set_header(shard, header, data)


def _record(d: Path, **change):
    """The first shard record of the main log, changed."""
    recs = map(json.loads, (d / "commits/main.jsonl").read_text().splitlines())
    return {**next(r for r in recs if "shard" in r), **change}


def _many_ids(d: Path) -> None:
    n = 2_000_000
    rec = _record(d, shard="shards/main/0000/main-000000.safetensors")
    with open(d / "commits/main.jsonl", "w") as f:  # one record listing 2M ids
        f.write(
            json.dumps(
                {**rec, "ids": list(range(1000, 1000 + n)), "lengths": [3] * n, "masked": [2] * n}
            )
            + "\n"
        )
    (d / "index.json").unlink()


def _deep(p: Path) -> None:
    p.write_text("[" * 200_000 + "]" * 200_000 + "\n")


def _outside_copy_of_shard(d: Path, outside: Path) -> None:
    s = shards(d)[0]
    copy = outside / f"copy-{d.name}.safetensors"
    shutil.copyfile(s, copy)
    _link(s, copy)


def _outside_dir(d: Path, outside: Path, sub: str) -> None:
    copy = outside / f"{d.name}-{sub}"
    shutil.copytree(d / sub, copy)
    _link(d / sub, copy)


def named_cases(outside: Path):
    """(name, what to do to a copy of the dataset, words the refusal must hold): the cases of
    issue 24, and the other ways a file can be swapped or a number crafted."""
    secret = outside / "secret.jsonl"
    first = lambda d: shards(d)[0]  # noqa: E731
    return [
        ("fifo-log", lambda d: _fifo(d / "commits/evil.jsonl"), "FIFO"),
        ("fifo-manifest", lambda d: _fifo(d / "manifest.json"), "FIFO"),
        ("fifo-index", lambda d: _fifo(d / "index.json"), "FIFO"),
        ("fifo-shard", lambda d: _fifo(first(d)), "FIFO"),
        ("fifo-token-freq", lambda d: _fifo(d / "token_freq.json"), "FIFO"),
        ("zero-log", lambda d: _link(d / "commits/evil.jsonl", "/dev/zero"), "outside"),
        ("zero-manifest", lambda d: _link(d / "manifest.json", "/dev/zero"), "outside"),
        ("zero-index", lambda d: _link(d / "index.json", "/dev/zero"), "outside"),
        ("zero-shard", lambda d: _link(first(d), "/dev/zero"), "outside"),
        ("zero-token-freq", lambda d: _link(d / "token_freq.json", "/dev/zero"), "outside"),
        ("log-to-outside-file", lambda d: _link(d / "commits/evil.jsonl", secret), "outside"),
        ("index-to-outside-file", lambda d: _link(d / "index.json", secret), "outside"),
        ("shard-to-outside-copy", lambda d: _outside_copy_of_shard(d, outside), "outside"),
        ("shard-dir-to-outside", lambda d: _outside_dir(d, outside, "shards"), "outside"),
        ("log-dir-to-outside", lambda d: _outside_dir(d, outside, "commits"), "outside"),
        (
            "log-dir-is-a-fifo",
            lambda d: (shutil.rmtree(d / "commits"), os.mkfifo(d / "commits")),
            "",
        ),
        ("log-is-a-folder", lambda d: (d / "commits/dir.jsonl").mkdir(), "directory"),
        (
            "ids-10e30",
            lambda d: _log_line(d, _record(d, shard="shards/main/x.safetensors", ids=[10**30])),
            "int64",
        ),
        (
            "negative-ids",
            lambda d: _log_line(d, _record(d, shard="shards/main/y.safetensors", ids=[-1, -2, -3])),
            "int64",
        ),
        ("skipped-id-10e30", lambda d: _log_line(d, {"skipped": {str(10**30): "x"}}), "int64"),
        (
            "covers-negative",
            lambda d: _edit_json(d / "index.json", lambda x: x["covers"].update(main=-5)),
            "covers",
        ),
        (
            "covers-not-an-object",
            lambda d: _edit_json(d / "index.json", lambda x: x.update(covers=[1])),
            "covers",
        ),
        (
            "offsets-past-end",
            lambda d: _offsets(first(d), lambda a, b, n: [a, b + 10**12]),
            "outside the file",
        ),
        (
            "offsets-reversed",
            lambda d: _offsets(first(d), lambda a, b, n: [b, a]),
            "outside the file",
        ),
        ("offsets-overlap", lambda d: _offsets(first(d), lambda a, b, n: [0, b - a]), "overlap"),
        (
            "header-length-huge",
            lambda d: _patch(first(d), 0, (2**62).to_bytes(8, "little")),
            "header length",
        ),
        ("header-not-utf8", lambda d: _patch(first(d), 9, b"\xf7\xff"), "JSON"),
        ("shard-truncated", lambda d: _cut(first(d), 0.5), "truncated"),
        ("shard-empty", lambda d: _cut(first(d), 0.0), "too short"),
        (
            "manifest-1M-layers",
            lambda d: _edit_json(
                d / "manifest.json", lambda m: m.update(layers=list(range(1_000_000)))
            ),
            "layers",
        ),
        (
            "manifest-hidden-huge",
            lambda d: _edit_json(
                d / "manifest.json", lambda m: m["model"].update(hidden_size=10**30)
            ),
            "hidden_size",
        ),
        ("manifest-a-list", lambda d: (d / "manifest.json").write_text("[1, 2]"), "object"),
        ("manifest-deep", lambda d: _deep(d / "manifest.json"), "JSON"),
        ("log-deep", lambda d: _deep(d / "commits/main.jsonl"), "does not parse"),
        ("record-2M-ids", _many_ids, ""),
        ("index-corrupt", lambda d: (d / "index.json").write_text('{"format": '), ""),
        (
            "index-huge-count",
            lambda d: _edit_json(
                d / "index.json", lambda x: x["shards"]["count"].__setitem__(0, 10**30)
            ),
            "",
        ),
        (
            "conversations-not-object",
            lambda d: _metadata(first(d), conversations="[1]"),
            "conversations",
        ),
        (
            "token-freq-vocab-huge",
            lambda d: _edit_json(
                d / "token_freq.json", lambda x: x.update(target_vocab_size=10**15)
            ),
            "",
        ),
        (
            "token-freq-negative-id",
            lambda d: _edit_json(d / "token_freq.json", lambda x: x["counts"].update({"-3": 7})),
            "",
        ),
    ]


def _patch(p: Path, at: int, data: bytes) -> None:
    with open(p, "r+b") as f:
        f.seek(at)
        f.write(data)


def _cut(p: Path, frac: float) -> None:
    os.truncate(p, int(p.stat().st_size * frac))


def _metadata(shard: Path, **md) -> None:
    header, data = _header(shard)
    header["__metadata__"].update(md)
    _set_header(shard, header, data)


def random_cases(d: Path, n_flips: int = 3, n_cuts: int = 2, seed: int = 24):
    """(name, change) pairs: seeded byte flips and truncations of every file kind."""
    rnd = random.Random(seed)
    kinds = {
        "manifest": "manifest.json",
        "index": "index.json",
        "log": "commits/main.jsonl",
        "log2": "commits/j1of2.jsonl",
        "shard": str(shards(d)[1].relative_to(d)),
        "token-freq": "token_freq.json",
    }
    out = []
    for kind, rel in kinds.items():
        size = (d / rel).stat().st_size
        for k in range(n_flips):
            spots = [
                (rnd.randrange(size), rnd.randrange(1, 256)) for _ in range(rnd.choice((1, 2, 8)))
            ]
            out.append((f"flip-{kind}-{k}", rel, spots, None))
        for k in range(n_cuts):
            out.append((f"cut-{kind}-{k}", rel, [], rnd.randrange(size)))
    return out


def _apply_random(d: Path, rel: str, spots, cut) -> None:
    p = d / rel
    raw = bytearray(p.read_bytes())
    for at, x in spots:
        raw[at] ^= x
    if cut is not None:
        raw = raw[:cut]
    p.write_bytes(bytes(raw))


def build(root: Path):
    """The base dataset, the outside folder, and every case under root/cases; returns
    {case name: words its refusal must hold ("" for none)}."""
    good = base(root / "good")
    outside = root / "outside"
    outside.mkdir()
    rec = {"skipped": {"12345": CANARY}}
    (outside / "secret.jsonl").write_text(
        "\n".join(json.dumps(rec) for _ in range(3)) + "\n" + CANARY + "\n"
    )
    cases = root / "cases"
    cases.mkdir()
    expect = {}
    shutil.copytree(good, cases / "good", symlinks=True)
    expect["good"] = None
    for name, change, words in named_cases(outside):
        shutil.copytree(good, cases / name, symlinks=True)
        change(cases / name)
        expect[name] = words
    for name, rel, spots, cut in random_cases(good):
        shutil.copytree(good, cases / name, symlinks=True)
        _apply_random(cases / name, rel, spots, cut)
        expect[name] = ""
    return expect


# ---------------------------------------------------------------------- the driver
class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def _tool(tool: str, case: Path, scratch: Path) -> int:
    """One tool on one case, as its command runs it; returns the exit status."""
    from hsdump.store import commits
    from hsdump.tools import export, inspect, verify, vocab

    if tool == "reader":  # the library: open, then read every record whole
        from hsdump.store.reader import HsdumpDataset

        try:
            ds = HsdumpDataset(str(case))
            for sid in ds.ids:
                rec = ds.get(sid)
                print(sid, int(rec["input_ids"].sum()), ds.conversation(sid))
        except (ValueError, OSError) as e:  # the reader's documented errors
            print(f"reader: {e}", file=sys.stderr)
            return 2
        return 0
    if tool == "resume":  # a writer resuming the folder (then closed without a commit)
        from hsdump.store.writer import DatasetWriter

        try:
            DatasetWriter(str(case), MANIFEST).close(commit=False)
        except (ValueError, OSError) as e:  # what extract reports with rc 2
            print(f"resume: {e}", file=sys.stderr)
            return 2
        return 0
    if tool == "verify":
        return verify.main([str(case)])
    if tool == "inspect":
        return inspect.main([str(case), "--json"])
    if tool == "export":
        return export.main(
            [str(case), str(scratch / "export"), "--to", "speculators-v1", "--no-progress"]
        )
    if tool == "messages":
        return export.main(
            [str(case), str(scratch / "messages"), "--to", "messages", "--no-progress"]
        )
    if tool == "vocab":
        return vocab.main([str(case), "-n", "2"])
    if tool == "compact":
        return commits.main([str(case)])
    raise ValueError(tool)


def _files_hold(folder: Path, text: str) -> bool:
    needle = text.encode()
    for p in folder.rglob("*") if folder.exists() else ():
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes():
            return True
    return False


def drive(cases: Path, out: Path) -> None:
    warnings.simplefilter("always")
    signal.signal(signal.SIGALRM, _on_alarm)
    results = {}
    for case in sorted(p for p in cases.iterdir() if p.is_dir() and not p.is_symlink()):
        for tool in TOOLS:
            scratch = cases.parent / "scratch" / case.name / tool
            scratch.mkdir(parents=True)
            so, se = io.StringIO(), io.StringIO()
            t0 = time.time()
            rc, crash = None, None
            signal.alarm(CASE_SECONDS)
            try:
                with (
                    contextlib.redirect_stdout(so),
                    contextlib.redirect_stderr(se),
                    warnings.catch_warnings(record=True) as caught,
                ):
                    warnings.simplefilter("always")
                    rc = _tool(tool, case, scratch)
                se.write("".join(f"warning: {w.message}\n" for w in caught))
            except _Timeout:
                crash = f"still running after {CASE_SECONDS} s"
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 2
            except BaseException:  # noqa: BLE001 - what the test reports
                crash = traceback.format_exc(limit=6)
            finally:
                signal.alarm(0)
            results[f"{case.name}/{tool}"] = {
                "rc": rc,
                "crash": crash,
                "seconds": round(time.time() - t0, 2),
                "stdout": so.getvalue()[-3000:],
                "stderr": se.getvalue()[-3000:],
                "canary": CANARY in so.getvalue() + se.getvalue() or _files_hold(scratch, CANARY),
                "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            }
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    drive(Path(sys.argv[1]), Path(sys.argv[2]))
