"""Issue 24, the everyday mistakes: each refusal says exactly what to do, before the heavy
imports, and leaves nothing behind."""

import subprocess
import sys

import harness
import pytest
import torch
from factories import H, rows_manifest

from hsdump.config import DatasetConfig
from hsdump.corpus.sources import load_rows, read_json_records
from hsdump.store.writer import DatasetWriter
from hsdump.tools import export as ex
from hsdump.tools.verify import verify

LAYERS = [1, 2, 3]


def dataset(path, final=()):
    w = DatasetWriter(str(path), rows_manifest(layers=LAYERS, final=list(final)))
    for sid in range(3):
        w.add(
            sid,
            [1, 2, 3],
            [0, 1, 1],
            [torch.randn(3, H) for _ in LAYERS],
            {k: torch.randn(3, H) for k in final},
        )
    w.close()
    return path


def hsdump(*args, cwd=None):
    """The installed console script, as a user runs it (tests/harness.py): (rc, stdout, stderr)."""
    return harness.hsdump(*args, cwd=cwd, timeout=300, split=True)


def test_export_refusal_names_both_fixes(tmp_path):
    src = dataset(tmp_path / "hs")
    rc, out, err = hsdump("export", src, tmp_path / "x", "--to", "speculators")
    assert rc == 2 and "Traceback" not in err
    assert "capture.final=[pre_norm]" in err and "--final-state last-layer" in err, err
    assert "wrong targets" in err and "4/3 of the disk" in err, err
    assert not (tmp_path / "x").exists()
    rc, out, err = hsdump("export", src, tmp_path / "sf", "--to", "specforge")
    assert rc == 2 and "capture.final=[post_norm]" in err, err


def test_a_dataset_with_pre_norm_exports_to_speculators_without_flags(tmp_path):
    src = dataset(tmp_path / "hs", final=["pre_norm"])
    c = ex.export(str(src), str(tmp_path / "x"), "speculators-v1", progress=False)
    assert c["written"] == 3


def test_messages_refused_leaves_no_dest(tmp_path):
    src = dataset(tmp_path / "hs")
    rc, _, err = hsdump("export", src, tmp_path / "m", "--to", "messages")
    assert rc == 2 and "holds no regenerated conversations" in err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("tool", ["verify", "inspect", "export", "vocab", "compact", "check"])
def test_usage_says_hsdump(tool):
    rc, out, err = hsdump(tool, "--help")
    assert rc == 0 and out.startswith(f"usage: hsdump {tool}"), out


@pytest.mark.parametrize("tool,rc", [("verify", 1), ("inspect", 2), ("export", 2), ("compact", 2)])
def test_a_folder_that_is_no_dataset_is_refused_before_torch_loads(tmp_path, tool, rc):
    args = [str(tmp_path)] + (
        [str(tmp_path / "x"), "--to", "speculators"] if tool == "export" else []
    )
    code = (
        "import sys; from hsdump.cli import main; rc = main(sys.argv[1:]); "
        "print('torch' in sys.modules); sys.exit(rc)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, tool, *args], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == rc and p.stdout.split()[-1] == "False", (p.stdout, p.stderr)
    assert "manifest.json" in p.stdout + p.stderr


def test_verify_knows_hsdumps_own_files(tmp_path):
    src = dataset(tmp_path / "hs")
    import numpy as np

    from hsdump.store.stats import _write

    _write(np.array([0, 3, 3]), 3, str(src), 10, "input_ids where loss_mask == 1")
    rc, out, err = hsdump("vocab", src, "-n", "2")
    assert rc == 0, err
    r = verify(src)
    assert r.ok and not [p for p in r.info if "not part of" in p.what], r.info


def test_a_corrupt_index_is_a_warning_in_one_line(tmp_path):
    src = dataset(tmp_path / "hs")
    (src / "index.json").write_text("{")
    rc, out, err = hsdump("inspect", src)
    assert rc == 0 and "samples" in out
    assert err.startswith("hsdump inspect: warning:") and len(err.splitlines()) == 1, err
    assert "index.json does not parse" in err and "logs hold every record" in err
    assert not verify(src).ok  # verify still reports it


def test_a_txt_source_is_refused_by_name(tmp_path):
    (tmp_path / "plain.txt").write_text("hello\n")
    with pytest.raises(
        ValueError,
        match=r"'.*plain.txt': a .txt file is not a format hsdump "
        r"reads; give a .jsonl or .json file",
    ):
        load_rows(DatasetConfig(path=str(tmp_path / "plain.txt")))


def test_non_utf8_bytes_are_counted(tmp_path, caplog):
    p = tmp_path / "chats.jsonl"
    p.write_bytes(b'{"text": "caf\xe9"}\n{"text": "ok \xef\xbf\xbd"}\n{"text": "\xff\xfe"}\n')
    recs, _, info = read_json_records(str(p))
    assert info["non_utf8"] == 3 and len(recs) == 3
    assert "3 byte sequences that are not UTF-8" in caplog.text
    p.write_bytes(b'[{"text": "\xff"}]')
    assert read_json_records(str(p))[2]["non_utf8"] == 1


def test_bad_input_is_raised_as_a_refusal():
    """hsdump's own bad-input errors are `hsdump.errors.Refusal`s (exit 2, not retried by
    `hsdump ray`); a plain ValueError is left only where no input is at fault: a caller's misuse
    of an API (fp8 shapes, an empty batch, token counts) and the row transport's own invariants
    (docs/errors.md). A new refusal raised as a plain ValueError fails here."""
    from factories import ROOT

    plain = {"hsdump/store/fp8.py": 3, "hsdump/store/stats.py": 2, "hsdump/store/reader.py": 1}
    plain["hsdump/capture/rows.py"] = 8
    plain["hsdump/online/vocab.py"] = 1  # token counts, as stats.py's: a negative id
    # a caller's misuse of the capture API: rows that do not fit the spec, a sample without mask
    plain["hsdump/capture/base.py"], plain["hsdump/store/writer.py"] = 2, 1
    found = {}
    for p in sorted((ROOT / "hsdump").rglob("*.py")):
        n = p.read_text().count("raise ValueError(")
        if n:
            found[str(p.relative_to(ROOT))] = n
    assert found == plain, found


@pytest.mark.parametrize(
    "tool, target, argv",
    [
        ("export", "export", ["OUT", "DEST", "--to", "messages"]),
        ("inspect", "gather", ["OUT"]),
        ("vocab", "_frequencies", ["OUT", "--draft-vocab-size", "8"]),
        ("preview", "compose_config", ["-n", "1"]),
        ("check", "check", ["OUT"]),
    ],
)
def test_only_a_refusal_exits_2_from_the_tools(tool, target, argv, monkeypatch, capsys):
    """A tool exits 2 for a refusal (and for a path it cannot read); another error, a
    library's ValueError or KeyError included, is a failure with its traceback (exit 1 from the
    command), not bad input."""
    import importlib

    from hsdump.errors import Refusal

    module = importlib.import_module(f"hsdump.tools.{tool}")
    for err in (ValueError("a library's error"), KeyError("k")):

        def fail(*a, err=err, **k):
            raise err

        monkeypatch.setattr(module, target, fail)
        with pytest.raises(type(err)):
            module.main(list(argv))

    def refuse(*a, **k):
        raise Refusal("bad input; the fix")

    monkeypatch.setattr(module, target, refuse)
    assert module.main(list(argv)) == 2
    assert "bad input; the fix" in capsys.readouterr().err
