"""One truth per class and drafter kind (issue 51): extract's refusal (check_kinds), `hsdump
export --kind`'s advice and docs/layers.md's table all come from hsdump.capture.families
(KIND_RULES, kind_support, kind_advice), and no message offers a capture that extract refuses.
No engine."""

import json
from pathlib import Path

import pytest
from factories import ROOT

from hsdump.capture import families as F
from hsdump.capture.kinds import KINDS
from hsdump.errors import Refusal
from hsdump.tools.export import ExportError, no_ids_reason, pick_kind

RELEASES = sorted(F.KIND_RULES)
ARCHS = [a for fam in F.FAMILIES for a in fam.architectures]


def test_docs_table_is_the_generated_one():
    begin, end = F.KINDS_TABLE
    doc = (ROOT / "docs" / "layers.md").read_text()
    i, j = doc.index(begin), doc.index(end)
    assert doc[i + len(begin) : j].strip() == F.kinds_table(), (
        "docs/layers.md's table of classes by kind is stale: paste "
        "hsdump.capture.families.kinds_table() between its markers"
    )
    # every verified class has a row, every release and kind a column
    rows = F.kinds_table().splitlines()[2:]
    assert len(rows) == len(ARCHS) and all(r.count("|") == 2 + 3 * len(RELEASES) for r in rows)


def test_classes_sglang_cannot_serve_a_kind_on_are_told_so_and_what_instead():
    """Qwen2 on 0.5.23 (the issue's class): SGLang has no DFlash setter there; the refusal says
    it cannot serve the kind and names EAGLE-3, never 'has not checked'."""
    assert F.kind_support("Qwen2ForCausalLM", "dflash", "0.5.23") == F.NO_SETTER
    assert F.kind_support("Qwen3_5ForCausalLM", "dflash", "0.5.17") == F.NO_SETTER
    assert F.kind_support("Llama4ForConditionalGeneration", "dflash", "0.5.23") == F.UNCHECKED
    for kinds in (["eagle3", "dflash"], list(KINDS)):  # the latter: capture=all_kinds
        with pytest.raises(Refusal) as e:
            F.check_kinds("Qwen2ForCausalLM", kinds, False, "0.5.23")
        msg = str(e.value)
        assert "SGLang 0.5.23 cannot serve a DFlash drafter of Qwen2ForCausalLM" in msg, msg
        assert "EAGLE-3 drafter instead (capture.kinds=[eagle3]" in msg and "not checked" not in msg
    F.check_kinds("Qwen2ForCausalLM", ["eagle3"], False, "0.5.23")  # what it advises is taken


def test_allow_unverified_captures_and_says_what_sglang_cannot(caplog):
    with caplog.at_level("WARNING", logger="hsdump.capture.families"):
        F.check_kinds("Qwen2ForCausalLM", ["eagle3", "dflash"], True, "0.5.23")
    assert "capturing dflash anyway; SGLang 0.5.23 cannot serve a DFlash drafter" in caplog.text


class _DS:
    def __init__(self, layers):
        self.layers, self.path = list(layers), "DS"


def _manifest(arch, depth, sglang, kinds=None):
    m = {"model": {"architecture": arch, "num_hidden_layers": depth}, "sglang_version": sglang}
    if kinds:
        m["kinds"] = kinds
    return m


@pytest.mark.parametrize("sglang", RELEASES)
def test_export_advice_names_no_capture_that_extract_refuses(sglang):
    """For every verified class and release: an EAGLE-3 dataset exported as DFlash or DSpark
    either names a re-extraction that check_kinds takes on that class and release, or says
    what SGLang cannot do and offers EAGLE-3 (kind_advice, extract's own words)."""
    for arch in ARCHS:
        if F.family_of(arch).verified_on(sglang) is None:
            continue  # the family gate refuses the class itself
        for kind in ("dflash", "dspark"):
            with pytest.raises(ExportError) as e:
                pick_kind(_DS([2, 15, 27]), _manifest(arch, 30, sglang), kind)
            msg = str(e.value)
            if "capture.kinds=[eagle3," in msg:
                again = msg.split("capture.kinds=[", 1)[1].split("]", 1)[0].split(",")
                F.check_kinds(arch, again, False, sglang)  # extract takes it
            else:
                assert F.kind_advice(arch, kind, sglang) in msg, (arch, kind, msg)
                assert "EAGLE-3" in msg and F.kind_support(arch, kind, sglang) != F.CHECKED


def test_export_closing_line_says_why_there_are_no_ids(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(_manifest("Qwen2ForCausalLM", 24, "0.5.23")))
    why = no_ids_reason(str(tmp_path), "dflash")
    assert why == F.kind_advice("Qwen2ForCausalLM", "dflash", "0.5.23") and "EAGLE-3" in why
    (tmp_path / "manifest.json").write_text(
        json.dumps(_manifest("Llama4ForConditionalGeneration", 24, "0.5.23"))
    )
    assert "allow_unverified" in no_ids_reason(str(tmp_path), "domino")  # DFlash's layers


def test_readme_names_the_classes_without_a_dflash_setter():
    """The README's list is KIND_RULES' for the newest release, and points to the table."""
    readme = " ".join(Path(ROOT / "README.md").read_text().split())
    newest = max(RELEASES, key=lambda v: tuple(int(x) for x in v.split(".")))
    said = readme.split("on the others (", 1)[1].split(f" on SGLang {newest})", 1)[0]
    want = {
        fam.name
        for fam in F.FAMILIES
        for a in fam.architectures
        if F.kind_support(a, "dflash", newest) == F.NO_SETTER
    }
    assert set(said.split(", ")) == want, (said, want)
    assert "classes by kind" in readme and "capture=all_kinds" in readme


def test_the_issue_path_end_to_end_on_the_dry_engine(tmp_path):
    """The issue's dead end, as a user meets it: an EAGLE-3 capture of a Qwen2-class model,
    then `hsdump export --kind dflash`: the export says SGLang cannot serve DFlash there and
    offers EAGLE-3, and what it offers extract takes; captured anyway with
    capture.allow_unverified=true, the export's closing line says the same, not "unknown"."""
    from harness import DRY, extract, hsdump

    from hsdump.testing import close_layers

    ckpt = close_layers.build(tmp_path / "qwen2")
    common = [DRY, f"model.path={ckpt}", "dataset.max_samples=2"]
    rc, log = extract(*common, "model.default_layers=[2,4,6]", out=tmp_path / "e3")
    assert rc == 0, log[-3000:]

    def export_dflash(src, dst):
        return hsdump("export", tmp_path / src, tmp_path / dst, "--to", "specforge", "--kind",
                      "dflash", "--allow-dry", split=True)  # fmt: skip

    rc, out, err = export_dflash("e3", "x")
    assert rc == 2 and "SGLang 0.5.23 cannot serve a DFlash drafter of Qwen2ForCausalLM" in err
    assert "capture.kinds=[eagle3," not in err and "EAGLE-3 drafter instead" in err, err
    rc, log = extract(*common, "capture.kinds=[eagle3,dflash]", out=tmp_path / "no")
    assert rc == 2 and "cannot serve a DFlash drafter" in log, log[-3000:]
    rc, log = extract(
        *common,
        "capture.kinds=[eagle3,dflash]",
        "capture.allow_unverified=true",
        out=tmp_path / "both",
    )
    assert rc == 0, log[-3000:]
    rc, out, err = export_dflash("both", "y")
    assert rc == 0, err
    assert "serving ids unknown for Qwen2ForCausalLM: SGLang 0.5.23 cannot serve" in out, out
