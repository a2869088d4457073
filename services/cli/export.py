"""`agon verify-export FILE`: check an exported game log (JSONL) offline, with no Redis.

Every line must be an event; the events must form one game's hash chain with seqs 1, 2,
... and replay move for move through the rules (`services.gamelog.export.verify_export`). That
proves the log is a game, not whose it is: anyone can edit an export and chain it again.
Given the server's export key (`--key B64`, or `--gateway URL` to fetch it from
`/.well-known/agon-export-key`), it also checks origin: the export's last line must be the
server's signature over exactly its event lines (`services.gamelog.export.origin_problem`).
Prints `ok: game <id>, N events, hash chain and replay verified` (`..., replay and origin
verified` with a key) and exits 0, or one line per problem and exits 1. A file that cannot
be read (missing, a directory, not UTF-8 text), a key that is no key or a gateway that does
not answer is one line on stderr and exit 2. `-` reads standard input.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from services.cli.options import UsageError
from services.gamelog.export import origin_problem, public_key, split_signature, verify_export

#: Where a gateway publishes its export key (`services.gateway.games.export_key`).
KEY_PATH = "/.well-known/agon-export-key"
FETCH_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        metavar="FILE",
        help="a game log exported as JSONL (GET /api/games/{id}/export); - reads stdin",
    )
    origin = parser.add_mutually_exclusive_group()
    origin.add_argument(
        "--key",
        metavar="B64",
        help="the server's export key (base64), to check the export's origin too",
    )
    origin.add_argument(
        "--gateway",
        metavar="URL",
        help=f"fetch the server's export key from URL{KEY_PATH} and check origin too",
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


def fetch_key(gateway: str) -> str:
    """The export key a gateway publishes, or a `UsageError` saying why there is none."""
    if not gateway.startswith(("http://", "https://")):
        raise UsageError(f"--gateway must be an http:// or https:// URL, not {gateway!r}")
    url = gateway.rstrip("/") + KEY_PATH
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as resp:
            body = json.loads(resp.read(64 << 10))
    except urllib.error.HTTPError as exc:
        raise UsageError(f"cannot fetch the export key from {url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise UsageError(f"cannot fetch the export key from {url}: {reason}") from None
    except ValueError:
        raise UsageError(
            f"cannot fetch the export key from {url}: the answer is not JSON"
        ) from None
    key = body.get("key") if isinstance(body, dict) else None
    if not isinstance(key, str):
        raise UsageError(f"cannot fetch the export key from {url}: the answer names no key")
    return key


def trusted_key(args: argparse.Namespace) -> Ed25519PublicKey | None:
    text = args.key if args.key is not None else fetch_key(args.gateway) if args.gateway else None
    if text is None:
        return None
    try:
        return public_key(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    text = read_text(args.file)
    trusted = trusted_key(args)
    game_id, count, problems = verify_export(text)
    if trusted is not None and (problem := origin_problem(text, trusted)) is not None:
        problems.append(problem)
    if problems:
        for problem in problems:
            print(problem)
        return 1
    if trusted is not None:
        checked = "hash chain, replay and origin verified"
    elif split_signature(text)[1] is not None:
        checked = "hash chain and replay verified; signed, origin not checked (give --key)"
    else:
        checked = "hash chain and replay verified"
    print(f"ok: game {game_id}, {count} events, {checked}")
    return 0
