"""Stop early, with the fix named, when the disk cannot hold what `make setup` installs.

`python3 tools/need_space.py FOLDER GB`: exit 0 when the file system holding FOLDER (or the
nearest folder above it that exists) has at least GB gigabytes free, else exit 2 and say how
much is free, how much the step needs and what to do. `HSDUMP_MIN_FREE_GB` overrides GB (0
turns the check off). Standard library only: it runs before the virtual environment exists.
"""

import os
import shutil
import sys


def free_gb(folder: str) -> float:
    path = os.path.abspath(folder)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free / 1e9


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: need_space.py FOLDER GB", file=sys.stderr)
        return 2
    folder, need = argv[1], float(os.environ.get("HSDUMP_MIN_FREE_GB", argv[2]))
    have = free_gb(folder)
    if have >= need:
        return 0
    print(
        f"error: {have:.1f} GB free on the disk of {os.path.abspath(folder)}, and the set-up and"
        f" the tests need about {need:g} GB (the virtual environment with SGLang and torch is"
        " about 11 GB; the tests' caches and temporary folders about 6 GB more). Free some space"
        " (old clones, /tmp), or set HSDUMP_MIN_FREE_GB to a lower figure if you know it fits.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
