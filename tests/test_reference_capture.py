"""bench/reference_capture.py's comparison (issue 44), on the logic that is hsdump's: the
records of the other capture are matched by position, ids and masks are compared, and each of
its tensors is named by the hsdump tensor it is closest to, so that a layer off by one, or
pre- against post-norm, names itself. SpecForge's own capture (its SGLang 0.5.14 in a venv of
its own, 11 GB) runs by hand and on the GPU host (docs/performance.md, "Against SpecForge's own
capture"); here its side is an hsdump export in SpecForge's record layout, which the script
takes as well. Run as a script: tests import nothing of bench/."""

import json
import sys

import harness
from factories import ROOT, make_dataset, stored_sample

LENS = {0: 5, 2: 17, 3: 9, 9: 40, 12: 12}
FINAL = ("pre_norm", "post_norm")


def _export(src, dest, kind="eagle3"):
    rc, log = harness.python("-m", "hsdump", "export", str(src), str(dest), "--to", "specforge",
                             "--kind", kind, "--no-progress", timeout=120)  # fmt: skip
    assert rc == 0, log[-3000:]
    return dest


def _compare(hs, other, out):
    """The script, forked by the fork server (torch is imported there already)."""
    cmd = [sys.executable, str(ROOT / "bench" / "reference_capture.py"), "compare", str(hs),
           str(other), "--json", str(out)]  # fmt: skip
    rc, log = harness.run_python_script(
        cmd, cwd=ROOT, env=harness.clean_env(None), timeout=120, wait=True
    )
    assert rc == 0, log[-3000:]
    return json.loads(out.read_text())


def test_compare_names_the_tensor_each_record_holds(tmp_path):
    a = make_dataset(tmp_path / "a", {s: stored_sample(s, n, final=FINAL) for s, n in LENS.items()})

    def rotated(s, n):  # the same samples, each layer slot holding the next layer's rows
        ids, mask, hs, fin = stored_sample(s, n, final=FINAL)
        return ids, mask, [hs[1], hs[2], hs[0]], {"pre_norm": fin["post_norm"],
                                                  "post_norm": fin["pre_norm"]}  # fmt: skip

    b = make_dataset(tmp_path / "b", {s: rotated(s, n) for s, n in LENS.items()})
    ex_a, ex_b = _export(a, tmp_path / "ex-a"), _export(b, tmp_path / "ex-b")

    same = _compare(ex_a, ex_a, tmp_path / "same.json")["summary"]
    assert (same["compared"], same["ids_equal"], same["loss_mask_equal"]) == (5, 5, 5)
    assert same["pad_rows"] == 0 and same["real_rows"] == sum(LENS.values())
    for name, t in same["tensors"].items():
        assert t["rel_worst"] == 0, name
        assert t["closest"] == {t["hsdump"]: 5}, name

    off = _compare(ex_a, ex_b, tmp_path / "off.json")["summary"]
    assert off["ids_equal"] == 5  # the same tokens: only the states differ
    want = {"aux 0": "layer 4", "aux 1": "layer 5", "aux 2": "layer 2", "final": "final/pre_norm"}
    for name, t in off["tensors"].items():
        assert t["rel_worst"] > 0.5, name
        assert t["closest"] == {want[name]: 5}, (name, t["closest"])


def test_compare_reads_the_dflash_familys_records(tmp_path):
    """SpecForge's DFlash records hold `hidden_states` [T, K*H] and no final state (DSpark adds
    `target_last_hidden_states`): the comparison splits them into the kind's layers. hsdump's
    `--kind dflash` and `--kind dspark` exports of the same samples, against themselves and
    against the rotated layers."""

    def with_kinds(path):  # the manifest records the DFlash family's layers, as capture.kinds does
        m = json.loads((path / "manifest.json").read_text())
        m["kinds"] = {k: {"layers": [2, 4, 5], "serving_ids": None} for k in ("dflash", "dspark")}
        (path / "manifest.json").write_text(json.dumps(m))
        return path

    def rotated(s, n):
        ids, mask, hs, fin = stored_sample(s, n, final=FINAL)
        return ids, mask, [hs[2], hs[0], hs[1]], fin

    a = with_kinds(make_dataset(tmp_path / "a", {s: stored_sample(s, n, final=FINAL)
                                                 for s, n in LENS.items()}))  # fmt: skip
    b = with_kinds(make_dataset(tmp_path / "b", {s: rotated(s, n) for s, n in LENS.items()}))
    for kind, final in (("dflash", False), ("dspark", True)):
        _export(a, tmp_path / f"a-{kind}", kind)
        _export(b, tmp_path / f"b-{kind}", kind)
        same = _compare(tmp_path / f"a-{kind}", tmp_path / f"a-{kind}", tmp_path / "s.json")
        t = same["summary"]["tensors"]
        assert sorted(t) == (["aux 0", "aux 1", "aux 2"] + (["final"] if final else [])), kind
        assert all(x["rel_worst"] == 0 for x in t.values()), kind
        off = _compare(tmp_path / f"a-{kind}", tmp_path / f"b-{kind}", tmp_path / "o.json")
        t = off["summary"]["tensors"]
        want = {"aux 0": "layer 5", "aux 1": "layer 2", "aux 2": "layer 4"}
        for name, w in want.items():
            assert t[name]["closest"] == {w: 5}, (kind, name, t[name]["closest"])
