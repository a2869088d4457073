"""The `agon` command: one entry point, each subcommand in its own module.

A subcommand is a module (or an object, named `module:attribute`) with
`add_arguments(parser)` and `run(args) -> int`. Only the chosen subcommand's module is
imported, so `agon conformance` never loads Redis code.

Every input error is one line on stderr and exit status 2, never a traceback: argparse
errors (the problem first, then the usage), a `services.cli.options.UsageError` raised by
`run`, and an unreadable file the user named. Output cut short by a closed pipe
(`agon play | head`) ends quietly with 0, Ctrl-C with 130. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, NoReturn

from services.cli.options import UsageError

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "conformance": (
        "services.cli.conformance",
        "replay Ludii trial and Pattern/Line verdict files",
    ),
    "bench": ("bench.benchmarks", "run a benchmark and print its figures"),
    "play": ("services.cli.play", "play seeded random games in the terminal, without Redis"),
    "schemas": ("services.cli.schemas", "export the JSON Schema of every wire model"),
    "up": ("services.cli.up:UP", "run every service in one process (embedded Redis by default)"),
    "selfplay": (
        "services.cli.selfplay:SELFPLAY",
        "play N games between bots through the pipeline",
    ),
    "verify": ("services.cli.admin:VERIFY", "replay every log, check hash chains and read models"),
    "rebuild": ("services.cli.admin:REBUILD", "recompute every read model from the logs"),
    "archive": ("services.cli.archive:ARCHIVE", "move finished games out of Redis into files"),
    "restore": ("services.cli.archive:RESTORE", "bring archived games back into Redis"),
    "verify-export": ("services.cli.export", "check an exported game log offline: chain, replay"),
    "replay": ("services.cli.replay", "step through a game's log (Redis or an export) as text"),
    "stats": ("services.cli.stats", "Elo, error bars, LOS and the SPRT for given results"),
    "tournament": ("services.cli.tournament", "create, run, follow or cancel a tournament"),
    "match": ("services.cli.tournament:MATCH", "play pairs of games until the SPRT decides"),
    "engine": ("services.cli.services:ENGINE", "run one engine service (validate, append, reply)"),
    "projector": (
        "services.cli.services:PROJECTOR",
        "run one projector (read models from the feeds)",
    ),
    "dispatcher": (
        "services.cli.services:DISPATCHER",
        "run one dispatcher (turn requests, clocks)",
    ),
    "bots": (
        "services.cli.bots:BOTS_COMMAND",
        "run bot workers (answer turn requests), or revoke an outside bot's keys",
    ),
    "gateway": ("services.cli.up:GATEWAY", "serve the HTTP/WebSocket API for people and bots"),
    "director": ("services.cli.services:DIRECTOR", "run one tournament director (shares them out)"),
    "status": ("services.cli.status", "processes, consumer lag, live games, Redis memory"),
    "acl": ("services.cli.acl", "write Redis ACL users, one per service kind, and their URLs"),
}

#: Exit statuses: a bad input, and Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse, but an error's first line is the problem; the usage follows it."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n{self.format_usage()}")


def build_parser(command: str | None) -> tuple[argparse.ArgumentParser, Any]:
    """The `agon` parser, with the arguments of `command` (if it is one); and its module."""
    parser = _Parser(prog="agon", description="Agon: games over Redis Streams")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    module = None
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            path, _, attribute = module_name.partition(":")
            module = importlib.import_module(path)
            if attribute:
                module = getattr(module, attribute)
            module.add_arguments(command_parser)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`agon play | head`): stop quietly. Point stdout at devnull
        # so the flush at interpreter exit does not fail again ("Exception ignored ...").
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _main(argv: list[str]) -> int:
    parser, module = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    assert module is not None  # argparse has rejected any other command
    try:
        status = int(module.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers, not at exit
        return status
    except UsageError as e:
        return _usage(args.command, str(e))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        path = _user_path(e.filename, args)
        if path is None:
            raise  # not a path the user gave: a bug, keep the traceback
        return _usage(args.command, f"cannot read {path}: {e.strerror}")


def _usage(command: str, message: str) -> int:
    sys.stdout.flush()
    print(f"agon {command}: {message}", file=sys.stderr)
    return EXIT_USAGE


def _user_path(filename: object, args: argparse.Namespace) -> str | None:
    """`filename` (of an OSError) as text if it is one of the user's arguments, else None."""
    if not isinstance(filename, str | bytes | os.PathLike):
        return None
    name = os.fsdecode(filename)
    for value in vars(args).values():
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, str | os.PathLike) and os.fsdecode(item) == name:
                return name
    return None


if __name__ == "__main__":
    sys.exit(main())
