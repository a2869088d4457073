"""`agon archive` and `agon restore`: finished games out of Redis into an archive directory,
and back (`services.archive` does the work; this is the command line).

`agon archive --older-than 7d --to DIR [--limit N] [--dry-run] [--json]` moves every game
that ended more than the given age ago (`30s`, `15m`, `2h`, `7d`) to DIR, with a progress bar
on stderr and a summary line: games archived, bytes written, the Redis memory freed (the
MEMORY USAGE of the keys deleted, taken before). `agon restore --from DIR ID... | --all`
brings games back, each file checked first (hash chain, replay, the sha256 the index
recorded); a file that fails is refused with one line naming the game and the problem, and
the command then exits 1. DIR defaults to `$AGON_ARCHIVE`. Both need `--redis-url` (or
`$REDIS_URL`): a fresh private server has nothing to archive. Bad input is one line and
exit 2. A failover midway is said in one line and the run starts again once Redis answers
(`--wait-s`): every game's move is guarded by a script, so a game done is not done twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from services.archive import (
    ARCHIVE_ENV,
    Archive,
    ArchiveStats,
    OnProgress,
    archive,
    parse_age,
    restore,
    valid_game_id,
)
from services.bus.connection import Client
from services.bus.keys import Keys
from services.cli.common import add_service_arguments, add_wait_argument, with_redis
from services.cli.options import UsageError, positive_int

KIB = 1024


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < KIB or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= KIB
    return f"{n:.1f} GiB"


def _directory(given: str, option: str, *, create: bool, missing_ok: bool = False) -> Path:
    """The archive directory the user named (or `$AGON_ARCHIVE`), usable (created, with
    `create`; or absent, with `missing_ok`); else UsageError."""
    if not given:
        raise UsageError(f"which archive? pass {option} DIR or set {ARCHIVE_ENV}")
    path = Path(given)
    if create and not path.exists():
        try:
            path.mkdir(parents=True)
        except OSError as exc:
            raise UsageError(f"cannot create {given}: {exc.strerror}") from None
    if missing_ok and not path.exists():
        return path
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise UsageError(f"{given} {what}: {option} names an archive directory")
    if create and not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write to {given}: pick a directory you may write to")
    return path


@contextmanager
def _progress(console: Console, what: str) -> Iterator[OnProgress]:
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = bar.add_task(what, total=None)

    def update(done: int, total: int | None) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        yield update


class _Archive:
    """`agon archive`."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser, private=False)
        add_wait_argument(parser)
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="AGE",
            help="archive games that ended more than AGE ago: 30s, 15m, 2h, 7d",
        )
        parser.add_argument(
            "--to",
            metavar="DIR",
            default=os.environ.get(ARCHIVE_ENV, ""),
            help=f"the archive directory, created if missing (default: ${ARCHIVE_ENV})",
        )
        parser.add_argument(
            "--limit", type=positive_int, metavar="N", help="archive at most N games"
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would go; write and delete nothing"
        )
        parser.add_argument("--json", action="store_true", help="end with a JSON summary line")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        try:
            age = parse_age(args.older_than)
        except ValueError as exc:
            raise UsageError(f"--older-than {exc}") from None
        dry = args.dry_run
        where = Archive(_directory(args.to, "--to", create=not dry, missing_ok=dry))
        console = Console(stderr=True)

        async def body(redis: Client, keys: Keys, url: str, stop: asyncio.Event) -> int:
            with _progress(console, "archiving" if not args.dry_run else "looking") as update:
                stats = await archive(
                    redis, keys, where, age, limit=args.limit, dry_run=args.dry_run,
                    progress=update,
                )  # fmt: skip
            for line in stats.failed:
                print(f"agon archive: {line}; left in Redis", file=sys.stderr)
            print(_archive_summary(stats, where, age))
            if args.json:
                print(json.dumps(stats.summary()))
            return 1 if stats.failed else 0

        return with_redis(args, body, embedded=False, repeatable=True)


def _archive_summary(stats: ArchiveStats, where: Archive, age: int) -> str:
    n = stats.archived
    per_game = f" ({_size(stats.bytes_written / n)}/game)" if n else ""
    rate = f", {n / stats.seconds:.1f} games/s" if stats.seconds and n else ""
    left = ", ".join(f"{count} {why}" for why, count in sorted(stats.skipped.items()))
    left = f"; left in Redis: {left}" if left else ""
    cutoff = datetime.now(UTC).timestamp() - age / 1000
    when = datetime.fromtimestamp(cutoff, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    if stats.dry_run:
        return (
            f"archive --dry-run: {n} of {stats.candidates} ended games would go to {where.root}"
            f" (ended before {when}), freeing about {_size(stats.redis_bytes)} of Redis"
            f" (MEMORY USAGE); nothing written{left}"
        )
    return (
        f"archive: {n} games archived to {where.root} (ended before {when}),"
        f" {_size(stats.bytes_written)} written{per_game}, about {_size(stats.redis_bytes)}"
        f" of Redis freed (MEMORY USAGE before deletion), {stats.seconds:.2f} s{rate}{left}"
    )


class _Restore:
    """`agon restore`."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser, private=False)
        add_wait_argument(parser)
        parser.add_argument("game_ids", nargs="*", metavar="ID", help="archived games to restore")
        parser.add_argument(
            "--from",
            dest="source",
            metavar="DIR",
            default=os.environ.get(ARCHIVE_ENV, ""),
            help=f"the archive directory (default: ${ARCHIVE_ENV})",
        )
        parser.add_argument("--all", action="store_true", help="restore every archived game")
        parser.add_argument("--json", action="store_true", help="end with a JSON summary line")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        if bool(args.game_ids) == args.all:
            raise UsageError(
                "name the games to restore (ID ...) or pass --all"
                + (", not both" if args.all else "")
            )
        where = Archive(_directory(args.source, "--from", create=False))
        ids = _ids(where, args.game_ids) if args.game_ids else _everything(where)
        console = Console(stderr=True)

        async def body(redis: Client, keys: Keys, url: str, stop: asyncio.Event) -> int:
            with _progress(console, "restoring") as update:
                stats = await restore(redis, keys, where, ids, progress=update)
            for line in stats.refused:
                print(f"agon restore: {line}; not restored", file=sys.stderr)
            for line in stats.skipped:
                print(f"  {line}")
            print(
                f"restore: {len(stats.restored)} of {len(ids)} games restored from {where.root}"
                f" ({stats.events} events, read models rewritten) in {stats.seconds:.2f} s;"
                f" {len(stats.skipped)} skipped, {len(stats.refused)} refused"
            )
            if args.json:
                print(json.dumps({**vars(stats), "seconds": round(stats.seconds, 3)}))
            return 1 if stats.refused else 0

        return with_redis(args, body, embedded=False, repeatable=True)


def _ids(where: Archive, game_ids: list[str]) -> list[str]:
    """The games named, each one the archive holds; else UsageError naming the first that
    is not."""
    for gid in game_ids:
        if not valid_game_id(gid):
            raise UsageError(f"{gid!r} is no game id (letters, digits, _ . - up to 64)")
    missing = [gid for gid in game_ids if where.file_of(gid, tree=True) is None]
    if missing:
        more = f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(
            f"game {missing[0]} is not in the archive {where.root}{more}: its {where.index.name}"
            " lists what is"
        )
    return list(dict.fromkeys(game_ids))


def _everything(where: Archive) -> list[str]:
    entries = where.entries()
    return [e.id for e in sorted(entries.values(), key=lambda e: (e.created, e.id))]


ARCHIVE = _Archive()
RESTORE = _Restore()
