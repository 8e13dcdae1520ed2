"""The command line: `coil demo`, `coil explain FILE.py:FN`, `coil fuzz`."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "demo": ("coil.cli.demo", "compile the seed's function and show every stage"),
    "explain": ("coil.cli.explain", "the seed's tables and the buffer-lifetime chart for FILE.py:FN"),
    "fuzz": ("coil.cli.fuzz", "run the random-graph generator against eager PyTorch"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coil", description="coil: PyTorch graphs to fused kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    command = importlib.import_module(COMMANDS[args.command][0])
    return int(command.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
