"""Does a bundle's package list import on the GPU host? Checked here, before device time.

    python tools/offline_host/bundle_view.py --site VENV/lib/python3.11/site-packages \
        --allow tools/offline_host/image-packages.txt --allow .gpu514/WHEELS.txt \
        --allow-names specforge accelerate --python VENV/bin/python \
        --modules sglang.srt.model_executor.model_runner,specforge.offline_capture.sglang_backend

A venv that has every package of the stack (here: `.venv-sf514`, SpecForge's own pins) is cut
down to a view of the packages the host will have: the image's (image-packages.txt, its package
list) plus the bundle's (its WHEELS.txt) plus any named. The view is a folder of links to those
distributions' top-level entries (importlib.metadata's RECORD of each). VENV's interpreter then
runs with `-S` and only the view (and the standard library) on sys.path, CUDA faked as one
H200 (torch.cuda's device queries patched; hsdump's libcuda stub on LD_LIBRARY_PATH for the
kernel package), and imports each module. A module the view lacks fails with the name of what
is missing: that package goes into the bundle's list. Prints one line a module and a JSON
summary; exits 1 when one fails. Versions in the venv may differ from the host's (python 3.11
here, 3.12 there): this checks which packages are needed, not their builds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, traceback
import torch
props = type("P", (), {"major": 9, "minor": 0, "name": "NVIDIA H200",
                       "total_memory": 150 << 30, "multi_processor_count": 132})()
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"
torch.cuda.get_device_properties = lambda *a, **k: props
out = {}
for m in sys.argv[1].split(","):
    try:
        __import__(m)
        out[m] = {"ok": True}
    except BaseException as e:  # noqa: BLE001
        out[m] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400],
                  "missing": getattr(e, "name", None)}
print("RESULT " + json.dumps(out))
"""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def allowed(files, names) -> set:
    out = {norm(n) for n in names}
    for f in files:
        for line in Path(f).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                out.add(norm(line.split("==")[0].strip()))
    return out


def view(site: Path, allow: set, dest: Path) -> list:
    """Links in `dest` to the top-level entries of the allowed distributions in `site`."""
    import importlib.metadata as md

    taken = []
    for dist in md.distributions(path=[str(site)]):
        if norm(dist.metadata["Name"]) not in allow:
            continue
        taken.append(dist.metadata["Name"])
        parts = {Path(str(f)).parts[:2] for f in dist.files or []}
        for top in sorted({p[0] for p in parts}):
            if top in ("..", "bin"):
                continue
            src = site / top
            if not src.exists():
                continue
            if src.is_dir() and not (src / "__init__.py").exists():
                # a namespace folder several distributions share (nvidia/, ...): a real folder
                # here, with links to this distribution's entries in it
                (dest / top).mkdir(exist_ok=True)
                for p in parts:
                    if p[0] == top and len(p) == 2 and not (dest / top / p[1]).exists():
                        if (src / p[1]).exists():
                            (dest / top / p[1]).symlink_to(src / p[1])
            elif not (dest / top).exists():
                (dest / top).symlink_to(src)
    return sorted(taken)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--site", required=True, help="the full venv's site-packages")
    ap.add_argument("--python", required=True, help="that venv's interpreter")
    ap.add_argument("--allow", action="append", default=[], help="a file of package names")
    ap.add_argument("--allow-names", nargs="*", default=[])
    ap.add_argument("--modules", required=True, help="comma-separated")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from hsdump.capture.patch import load_libcuda_stub

    load_libcuda_stub()  # LD_LIBRARY_PATH for the child
    allow = allowed(a.allow, a.allow_names)
    with tempfile.TemporaryDirectory(prefix="bundle-view-") as tmp:
        dest = Path(tmp) / "site"
        dest.mkdir()
        taken = view(Path(a.site).resolve(), allow, dest)
        stdlib = subprocess.run(
            [a.python, "-S", "-c", "import sys; print('\\n'.join(p for p in sys.path if p))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(dest), *stdlib]))
        env.pop("PYTHONHOME", None)
        p = subprocess.run(
            [a.python, "-S", "-c", CHILD, a.modules],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        print(p.stdout[-3000:], p.stderr[-3000:], file=sys.stderr)
        return 2
    res = json.loads(line[0][len("RESULT ") :])
    for m, r in res.items():
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {m}" + ("" if r["ok"] else f": {r['error']}"))
    missing = sorted({r["missing"] for r in res.values() if not r["ok"] and r.get("missing")})
    summary = {"distributions_in_view": len(taken), "modules": res, "missing": missing}
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({"distributions_in_view": len(taken), "missing": missing}))
    return 0 if all(r["ok"] for r in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
