"""`agon verify-export FILE`: check an exported game log (JSONL) offline, with no Redis.

Every line must be an event; the events must form one game's hash chain with seqs 1, 2,
... and replay move for move through the rules (`services.export.verify_export`). Prints
`ok: game <id>, N events, hash chain and replay verified` and exits 0, or one line per
problem and exits 1. A file that cannot be read (missing, a directory, not UTF-8 text)
is one line on stderr and exit 2. `-` reads standard input.
"""

from __future__ import annotations

import argparse
import sys

from services.export import verify_export
from services.options import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        metavar="FILE",
        help="a game log exported as JSONL (GET /api/games/{id}/export); - reads stdin",
    )


def read_text(name: str) -> str:
    """The UTF-8 text of file `name` (`-`: standard input), or a `UsageError` saying why not."""
    try:
        if name == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(name, "rb") as f:
                data = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"cannot read {name}: not UTF-8 text (byte {exc.start}); give a JSONL export"
        ) from None


def run(args: argparse.Namespace) -> int:
    game_id, count, problems = verify_export(read_text(args.file))
    if problems:
        for problem in problems:
            print(problem)
        return 1
    print(f"ok: game {game_id}, {count} events, hash chain and replay verified")
    return 0
