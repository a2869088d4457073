"""The `agon` command: one entry point, each subcommand in its own module.

A subcommand module exposes `add_arguments(parser)` and `run(args) -> int`; it is
imported only when used, so `agon conformance` never imports Redis code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "conformance": ("services.conformance", "replay Ludii trial and Pattern/Line verdict files"),
    "bench": ("services.benchmarks", "run a benchmark and print its figures"),
    "play": ("services.play", "play seeded random games in the terminal"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agon", description="Agon: games over Redis Streams")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        modules[name] = module
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
