"""Rebuild and install a bundle (make-bundle.sh: 0523, or 0514 for SpecForge's side) on the GPU host.

    python3 tools/offline_host/install523.py [--parts /tmp/gpu523-parts] [--site /tmp/site523]

The parts (`pNN/` folders, stashed by run-0523.sh, one at a time where they arrive one at a time) hold pieces
`<file>.NNN` of the payload files listed in their MANIFEST: site.tar.xz (SGLang and the rest,
trimmed) and the wheels of torch, triton and nvidia-nccl-cu13 (and cuDNN if it was built with
WITH_CUDNN=1). Each file is joined in index order, checked against its sha256, and extracted
into the site folder: the tarball with tarfile, the wheels with zipfile in parallel processes
(a wheel's `*.data/purelib` and `platlib` go to the top, its scripts and headers are dropped),
which is what `pip install --no-deps --target` does minus the console scripts and the RECORD
bookkeeping. A site folder that already holds this bundle id is left alone. Standard library
only: it runs on the image's python before anything of the bundle exists.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import sys
import tarfile
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor


def read_manifest(path: str) -> dict:
    man = {"files": []}
    for line in open(path):
        line = line.strip()
        if line.startswith("FILE "):
            _, name, sha, n, size = line.split()
            man["files"].append({"name": name, "sha256": sha, "pieces": int(n), "size": int(size)})
        elif "=" in line:
            k, v = line.split("=", 1)
            man[k] = v
    return man


def pieces_of(parts: str, name: str):
    found = glob.glob(os.path.join(parts, "p*", name + ".[0-9][0-9][0-9]"))
    return sorted(found, key=lambda p: int(p.rsplit(".", 1)[1]))


def join(parts: str, f: dict, dst: str) -> None:
    ps = pieces_of(parts, f["name"])
    idx = [int(p.rsplit(".", 1)[1]) for p in ps]
    if idx != list(range(f["pieces"])):
        missing = sorted(set(range(f["pieces"])) - set(idx))
        raise SystemExit(
            f"[gpu523] {f['name']}: pieces {missing} missing in {parts}: a part was not "
            "stashed (or the host was restarted: start again from p00)"
        )
    h = hashlib.sha256()
    with open(dst, "wb") as out:
        for p in ps:
            with open(p, "rb") as fh:
                while True:
                    b = fh.read(1 << 24)
                    if not b:
                        break
                    h.update(b)
                    out.write(b)
    if h.hexdigest() != f["sha256"]:
        raise SystemExit(f"[gpu523] {f['name']}: sha256 mismatch: stale or partial pieces")


def _target_name(member: str):
    """Where a wheel member goes under the site folder, or None (dropped)."""
    top, _, rest = member.partition("/")
    if top.endswith(".data"):
        kind, _, rest2 = rest.partition("/")
        return rest2 if kind in ("purelib", "platlib") and rest2 else None
    return member


def _extract_chunk(args) -> int:
    wheel, members, site = args
    n = 0
    with zipfile.ZipFile(wheel) as z:
        for m in members:
            info = z.getinfo(m)
            t = _target_name(m)
            if t is None or m.endswith("/"):
                continue
            dst = os.path.join(site, t)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with z.open(info) as src, open(dst, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 22)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(dst, mode | 0o600)
            n += 1
    return n


def extract_wheels(wheels, site: str, jobs: int) -> None:
    work = []
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            infos = sorted(z.infolist(), key=lambda i: -i.file_size)
        # spread the big members over the workers: round-robin by size
        k = max(1, min(jobs, len(infos)))
        buckets = [[] for _ in range(k)]
        for i, info in enumerate(infos):
            buckets[i % k].append(info.filename)
        work += [(w, b, site) for b in buckets if b]
    with ProcessPoolExecutor(max_workers=jobs) as ex:
        total = sum(ex.map(_extract_chunk, work))
    print(f"[gpu523] extracted {total} files from {len(wheels)} wheel(s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="/tmp/gpu523-parts")
    ap.add_argument("--site", default="/tmp/site523")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--keep-joined", action="store_true")
    args = ap.parse_args()
    mans = sorted(glob.glob(os.path.join(args.parts, "p*", "MANIFEST")))
    if not mans:
        raise SystemExit(f"[gpu523] no {args.parts}/pNN/MANIFEST: stash the parts first")
    man = read_manifest(mans[-1])
    bid = man["BUNDLE_ID"]
    stale = [m for m in mans if read_manifest(m)["BUNDLE_ID"] != bid]
    if stale:
        raise SystemExit(f"[gpu523] parts of another bundle in {args.parts}: {stale}")
    stamp = os.path.join(args.site, ".bundle_id")
    if os.path.exists(stamp) and open(stamp).read().strip() == bid:
        print(f"[gpu523] bundle {bid} already installed in {args.site}")
        return 0
    t0 = time.time()
    joined = os.path.join(args.parts, "joined")
    os.makedirs(joined, exist_ok=True)
    for f in man["files"]:
        join(args.parts, f, os.path.join(joined, f["name"]))
    t1 = time.time()
    print(f"[gpu523] joined and checked {len(man['files'])} file(s) in {t1 - t0:.1f}s")
    shutil.rmtree(args.site, ignore_errors=True)
    os.makedirs(args.site)
    wheels = [os.path.join(joined, f["name"]) for f in man["files"] if f["name"].endswith(".whl")]
    tars = [os.path.join(joined, f["name"]) for f in man["files"] if f["name"].endswith(".tar.xz")]
    # the wheels first, in parallel, while the main process unpacks the tarball
    import threading

    err = []

    def wheels_job():
        try:
            extract_wheels(wheels, args.site, args.jobs)
        except BaseException as e:  # noqa: BLE001
            err.append(e)

    th = threading.Thread(target=wheels_job)
    th.start()
    for t in tars:
        with tarfile.open(t, mode="r:xz") as tf:
            try:
                tf.extractall(args.site, filter="fully_trusted")
            except TypeError:
                tf.extractall(args.site)
    th.join()
    if err:
        raise err[0]
    if not args.keep_joined:
        shutil.rmtree(joined, ignore_errors=True)
    # torch, triton and NCCL travel only in a bundle that carries their wheels (0523; the 0514
    # stack takes the image's own)
    carried = {f["name"].split("-")[0] for f in man["files"] if f["name"].endswith(".whl")}
    musts = ["sglang/__init__.py"] + [
        m
        for w, m in (
            ("torch", "torch/__init__.py"),
            ("triton", "triton/__init__.py"),
            ("nvidia_nccl_cu13", "nvidia/nccl/lib"),
        )
        if w in carried
    ]
    for must in musts:
        if not os.path.exists(os.path.join(args.site, must)):
            raise SystemExit(f"[gpu523] {must} missing after the install")
    with open(stamp, "w") as fh:
        fh.write(bid + "\n")
    info = {
        "bundle_id": bid,
        "site": args.site,
        "join_s": round(t1 - t0, 1),
        "extract_s": round(time.time() - t1, 1),
    }
    print("[gpu523] installed " + json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
