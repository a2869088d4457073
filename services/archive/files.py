"""The archive's files and their index: finished games' logs as compressed JSONL files.

An archive is a directory (any one a user mounts). A game's log goes to
`<dir>/<rules>/<YYYY-MM of its end>/<game id>.jsonl.gz`: the JSONL export of
`services.gamelog.export` (the hash-chained log as stored, what `GET /api/games/{id}/export` serves
and `agon verify-export` checks), gzip-compressed with no time in the header, so one log
always makes the same bytes. `<dir>/index.jsonl` lists the archived games, one JSON line
each (id, rules, options, seats, status, result, reason, created, ended, path, the file's
sha256), appended under an exclusive lock, so listing walks no tree. A restored game gets a
later line `{"id", "restored"}`; the last line about a game wins.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import functools
import gzip
import hashlib
import json
import logging
import os
import threading
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from schemas.base import BOT_NAME_RE
from schemas.codec import DecodeError, unpack
from schemas.views import GameSummary, SeatView, Status, StoredView
from services.bus.clients import LogEntry, parse_cursor
from services.gamelog.export import ExportError, export_jsonl, log_problems, read_jsonl

log = logging.getLogger("agon.archive")

#: Where `agon archive`, `restore`, `gateway` and `replay` find the archive by default.
ARCHIVE_ENV = "AGON_ARCHIVE"
INDEX = "index.jsonl"
SUFFIX = ".jsonl.gz"
#: The status `GET /api/games?status=archived` lists.
ARCHIVED = "archived"
UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class ArchiveError(Exception):
    """An archived file that cannot be written, read back or trusted; the message is one line
    naming the game and the problem."""


def parse_age(text: str) -> int:
    """`30s`, `15m`, `2h` or `7d` as milliseconds; ValueError says what is accepted."""
    number, unit = text.strip()[:-1], text.strip()[-1:]
    if unit not in UNITS or not number.isdecimal():
        raise ValueError(
            f"{text!r} is no age: give a whole number and a unit s, m, h or d (30s, 15m, 2h, 7d)"
        )
    return int(number) * UNITS[unit]


def valid_game_id(game_id: str) -> bool:
    """Whether `game_id` is one the arena could have made (letters, digits, `_.-`)."""
    return BOT_NAME_RE.fullmatch(game_id) is not None


# -- the index ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One archived game, as its index line says."""

    id: str
    game: str
    options: dict[str, str]
    seats: list[SeatView]
    status: Status
    seq: int
    ply: int
    scores: list[int] | None
    #: the winning seat, 0 for a draw or no result
    result: int
    reason: str
    detail: str
    created: int
    ended: int
    tournament: str | None
    #: the file, relative to the archive directory
    path: str
    sha256: str
    size: int
    archived: int

    @classmethod
    def of(cls, view: StoredView, path: str, data: bytes, archived: int) -> Entry:
        """The entry of a game archived from its projector view (`GameFold.view`)."""
        result = view["result"]
        return cls(
            id=view["game_id"],
            game=view["game"],
            options=dict(view["options"]),
            seats=list(view["seats"]),
            status=view["status"],
            seq=view["seq"],
            ply=view["ply"],
            scores=view["scores"],
            result=result["winner"] if result else 0,
            reason=result["reason"] if result else "",
            detail=result["detail"] if result else "",
            created=view["created"],
            ended=view["updated"],
            tournament=view.get("tournament"),
            path=path,
            sha256=hashlib.sha256(data).hexdigest(),
            size=len(data),
            archived=archived,
        )

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Entry:
        """An entry from its line's object (fields a later version adds are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names})

    def summary(self) -> GameSummary:
        """The game as `GET /api/games` lists it, archived."""
        return GameSummary(
            id=self.id,
            game=self.game,
            options=self.options,
            status=self.status,
            seq=self.seq,
            ply=self.ply,
            to_move=None,
            seats=self.seats,
            scores=self.scores,
            result={"winner": self.result or None, "reason": self.reason},
            created=self.created,
            updated=self.ended,
            archived=True,
        )


def _line(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _month(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Archive:
    """An archive directory: its files and its index (read incrementally, as it grows)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.index = self.root / INDEX
        self._lock = threading.Lock()
        self._inode: int | None = None
        self._offset = 0
        self._entries: dict[str, Entry] = {}
        #: (created, id) of every entry, ascending: pages walk it from the end
        self._order: list[tuple[int, str]] | None = None
        self.bad_lines = 0

    # -- reading the index ----------------------------------------------------------------
    def refresh(self) -> None:
        """Read what was appended to the index since the last look (all of it if the file
        was replaced); a line cut short by a crashed writer waits for its newline."""
        with self._lock:
            try:
                st = os.stat(self.index)
            except FileNotFoundError:
                self._inode, self._offset, self._entries, self._order = None, 0, {}, None
                return
            if st.st_ino != self._inode or st.st_size < self._offset:
                self._inode, self._offset, self._entries, self._order = st.st_ino, 0, {}, None
            if st.st_size == self._offset:
                return
            with open(self.index, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(st.st_size - self._offset)
            end = chunk.rfind(b"\n") + 1
            for raw in chunk[:end].splitlines():
                self._read_line(raw)
            self._offset += end
            self._order = None

    def _read_line(self, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            obj = json.loads(raw)
            gid = obj["id"]
            if "restored" in obj:
                self._entries.pop(gid, None)
            else:
                self._entries[gid] = Entry.parse(obj)
        except (ValueError, KeyError, TypeError):
            self.bad_lines += 1
            log.warning("archive %s: an unreadable index line: %.200r", self.root, raw)

    def entries(self) -> dict[str, Entry]:
        """Every archived game by id, as the index says now."""
        self.refresh()
        return dict(self._entries)

    def find(self, game_id: str) -> Entry | None:
        self.refresh()
        return self._entries.get(game_id)

    def page(
        self,
        *,
        game: str | None = None,
        player: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Entry], str | None]:
        """Archived games newest first (by creation, as the live list), filtered; the
        cursor of the next page (`<created>:<id>`, as the live list's) or None."""
        before = parse_cursor(cursor)
        self.refresh()
        with self._lock:
            if self._order is None:
                self._order = sorted((e.created, e.id) for e in self._entries.values())
            order, entries = self._order, self._entries
        at = len(order) if before is None else bisect.bisect_left(order, before)
        found: list[Entry] = []
        for i in range(at - 1, -1, -1):
            e = entries.get(order[i][1])
            if e is None or (game and e.game != game):
                continue
            if player and player not in {s.get("name") for s in e.seats}:
                continue
            found.append(e)
            if len(found) > limit:
                break
        more = len(found) > limit
        found = found[:limit]
        return found, (f"{found[-1].created}:{found[-1].id}" if more else None)

    # -- writing the index ----------------------------------------------------------------
    def append(self, lines: Sequence[Mapping[str, Any]]) -> None:
        """Append lines to the index under an exclusive lock (archivers may race), fsynced.
        A line cut short by a crashed writer is ended first, so it spoils only itself."""
        if not lines:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        data = b"".join(_line(obj) for obj in lines)
        fd = os.open(self.index, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)  # and with it the lock

    # -- files ----------------------------------------------------------------------------
    def store(self, entries: Sequence[LogEntry], view: StoredView, now: int) -> Entry:
        """Write a finished game's log to its file (temporary name, fsync, rename), read it
        back and check it; its index entry (not yet appended), from its view. `ArchiveError`
        if the file does not come back as the same sound log."""
        gid = view["game_id"]
        data = gzip.compress(export_jsonl(entries).encode("ascii"), mtime=0)
        rel = f"{view['game']}/{_month(view['updated'])}/{gid}{SUFFIX}"
        final = self.root / rel
        made = [d for d in (final.parent.parent, final.parent) if not d.is_dir()]
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        for directory in {final.parent, *(d.parent for d in made)}:
            _fsync_dir(directory)
        back = final.read_bytes()
        if back != data:
            raise ArchiveError(f"game {gid}: {final} reads back other bytes")
        stored = self.verified(gid, rel, back)
        if [e.data for e in stored] != [e.data for e in entries]:
            raise ArchiveError(f"game {gid}: {final} reads back another log")
        return Entry.of(view, rel, back, now)

    def verified(self, game_id: str, rel: str, data: bytes) -> list[LogEntry]:
        """The log a file holds, checked: gzip, JSONL, game id, hash chain, replay."""
        entries = self.read(game_id, rel, data)
        problems = log_problems(entries)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ArchiveError(f"game {game_id}: {rel}: {problems[0]}{more}")
        return entries

    def read(self, game_id: str, rel: str, data: bytes) -> list[LogEntry]:
        """The events a file holds, which must be game `game_id`'s (not checked further)."""
        try:
            text = gzip.decompress(data).decode("ascii")
            entries = read_jsonl(text)
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
            raise ArchiveError(
                f"game {game_id}: {rel} is not a gzip-compressed export ({exc})"
            ) from None
        except ExportError as exc:
            raise ArchiveError(f"game {game_id}: {rel}: {exc}") from None
        try:
            gid = unpack(entries[0].data).get("game_id")
        except DecodeError:
            gid = None  # `log_problems` names it
        if gid is not None and gid != game_id:
            raise ArchiveError(f"game {game_id}: {rel} holds the log of game {gid}")
        return entries

    def file_of(self, game_id: str, *, tree: bool = False) -> tuple[str, Entry | None] | None:
        """The file of an archived game (relative path) and its index entry: from the index,
        else, with `tree` (an entry lost to a crash before it was written), from the tree."""
        entry = self.find(game_id)
        if entry is not None:
            return entry.path, entry
        if not tree or not valid_game_id(game_id):
            return None
        for path in sorted(self.root.glob(f"*/*/{game_id}{SUFFIX}")):
            return path.relative_to(self.root).as_posix(), None
        return None

    def load(
        self, game_id: str, *, replay: bool = False, tree: bool = False
    ) -> list[LogEntry] | None:
        """An archived game's log (None if the archive has no such game, `file_of`): the
        file must have the sha256 the index recorded; with `replay` its chain and replay are
        checked too (the sha256 already vouches for a file that was checked when archived)."""
        found = self.file_of(game_id, tree=tree)
        if found is None:
            return None
        rel, entry = found
        path = self.root / rel
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ArchiveError(f"game {game_id}: {path} is missing") from None
        except OSError as exc:
            raise ArchiveError(f"game {game_id}: cannot read {path}: {exc.strerror}") from None
        entries = self.verified(game_id, rel, data) if replay else self.read(game_id, rel, data)
        if entry is not None and hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ArchiveError(
                f"game {game_id}: {rel} is not the file archived (its sha256 differs from the"
                " index's)"
            )
        return entries


@functools.cache
def open_archive(root: str) -> Archive:
    """One `Archive` per directory per process (the gateway keeps its index read)."""
    return Archive(root)
