"""The `agon` command: one entry point, each subcommand in its own module.

A subcommand is a module (or an object, named `module:attribute`) with
`add_arguments(parser)` and `run(args) -> int`. Only the chosen subcommand's module is
imported, so `agon conformance` never loads Redis code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "conformance": ("services.conformance", "replay Ludii trial and Pattern/Line verdict files"),
    "bench": ("services.benchmarks", "run a benchmark and print its figures"),
    "play": ("services.play", "play seeded random games in the terminal, without Redis"),
    "schemas": ("services.schemas_cmd", "export the JSON Schema of every wire model"),
    "up": ("services.runtime:UP", "run every service in one process (embedded Redis by default)"),
    "selfplay": ("services.runtime:SELFPLAY", "play N games between bots through the pipeline"),
    "verify": ("services.runtime:VERIFY", "replay every log, check hash chains and read models"),
    "rebuild": ("services.runtime:REBUILD", "recompute every read model from the logs"),
    "engine": ("services.engine_service", "run one engine service (validate, append, reply)"),
    "projector": ("services.runtime:PROJECTOR", "run one projector (read models from the feeds)"),
    "dispatcher": ("services.runtime:DISPATCHER", "run one dispatcher (turn requests, clocks)"),
    "bots": ("services.runtime:BOTS", "run bot workers (answer turn requests)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="agon", description="Agon: games over Redis Streams")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = argv[0] if argv else None
    module = None
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            path, _, attribute = module_name.partition(":")
            module = importlib.import_module(path)
            if attribute:
                module = getattr(module, attribute)
            module.add_arguments(command_parser)
    args = parser.parse_args(argv)
    assert module is not None  # argparse has rejected any other command
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
