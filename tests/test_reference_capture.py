"""bench/reference_capture.py's comparison (issue 44), on the logic that is hsdump's: the
records of the other capture are matched by position, ids and masks are compared, and each of
its tensors is named by the hsdump tensor it is closest to, so that a layer off by one, or
pre- against post-norm, names itself. SpecForge's own capture (its SGLang 0.5.14 in a venv of
its own, 11 GB) runs by hand and on the GPU host (docs/performance.md, "Against SpecForge's own
capture"); here its side is an hsdump export in SpecForge's record layout, which the script
takes as well. Run as a script: tests import nothing of bench/."""

import json
import subprocess
import sys

from factories import ROOT, make_dataset, stored_sample

LENS = {0: 5, 2: 17, 3: 9, 9: 40, 12: 12}
FINAL = ("pre_norm", "post_norm")


def _export(src, dest):
    p = subprocess.run(
        [sys.executable, "-m", "hsdump", "export", str(src), str(dest), "--to", "specforge",
         "--kind", "eagle3", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    return dest


def _compare(hs, other, out):
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "reference_capture.py"), "compare", str(hs),
         str(other), "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
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
