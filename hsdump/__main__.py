"""`python -m hsdump COMMAND ...`: the same commands as the `hsdump` console script (hsdump.cli).

Each dataset tool lives in its own module with a `main(argv) -> int` function; `extract` is the
Hydra app of extract.py.
"""

from hsdump.cli import finish, main

if __name__ == "__main__":
    finish(main)
