"""`agon schemas`: export the JSON Schema of every wire model, for clients in other languages.

Prints one JSON document keyed by direction (commands, events, replies, turns), or
with `--out DIR` writes one `<direction>.schema.json` file per direction.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from schemas.codec import schemas
from services.cli.options import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--direction",
        choices=["commands", "events", "replies", "turns"],
        help="only this direction's closed set",
    )
    parser.add_argument("--out", type=Path, help="write one <direction>.schema.json per direction")


def run(args: argparse.Namespace) -> int:
    everything = schemas()
    chosen = {args.direction: everything[args.direction]} if args.direction else everything
    if args.out is None:
        print(json.dumps(chosen, indent=2, sort_keys=True))
        return 0
    for direction, schema in chosen.items():
        path = args.out / f"{direction}.schema.json"
        _write(path, json.dumps(schema, indent=2, sort_keys=True) + "\n")
        print(path)
    return 0


def _write(path: Path, text: str) -> None:
    """Write `text` to `path` under `--out`; a path that cannot be written is a UsageError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:  # --out is a file, or not writable
        raise UsageError(
            f"cannot write {path}: {e.strerror or e}; --out wants a directory you can write to"
        ) from None
