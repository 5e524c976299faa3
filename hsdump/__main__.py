"""`python -m hsdump COMMAND ...`: tools that work on datasets and configs (no engine).

Each command lives in its own module with a `main(argv) -> int` function.
"""

import importlib
import sys

COMMANDS = {
    "verify": ("hsdump.verify", "check a dataset's index, checksums and every sample"),
    "preview": ("hsdump.preview", "show rendered samples with the loss-masked tokens marked"),
    "vocab": ("hsdump.vocab", "write the EAGLE-3 draft vocabulary mapping (d2t, t2d)"),
    "inspect": ("hsdump.inspect", "print a dataset's facts and plot its length histograms"),
    "export": ("hsdump.export", "convert a dataset to a peer trainer's layout"),
}


def usage() -> str:
    lines = ["usage: python -m hsdump COMMAND [args]", "", "commands:"]
    lines += [f"  {name:8s} {doc}" for name, (_, doc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as e:
        if e.name == COMMANDS[name][0]:
            print(f"`{name}` is not available in this version of hsdump", file=sys.stderr)
            return 2
        raise
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
