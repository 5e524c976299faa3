"""`python -m hsdump.testing.families [NAME ...]`: build the named families' checkpoints (default:
every family) and print each one's folder."""

import sys

from hsdump.testing.families import FAMILIES, build

for n in sys.argv[1:] or FAMILIES:
    print(n, build(n))
