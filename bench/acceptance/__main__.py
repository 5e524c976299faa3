"""`python3 -m bench.acceptance <sub>`: the SpecForge pipeline's CLI (README.md)."""

import sys

from .cli import main

if __name__ == "__main__":  # required: SGLang spawns its scheduler processes
    sys.exit(main())
