"""`python3 -m bench.acceptance.speculators <sub>`: the speculators pipeline's CLI."""

import sys

from .cli import main

if __name__ == "__main__":  # required: SGLang spawns its scheduler processes
    sys.exit(main())
