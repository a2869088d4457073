"""`agon verify`: every log checked as a hash chain, replayed through the rules, and every
registered read model compared with what the logs imply.

It reads everything partition by partition and scans keys on every node of a cluster. A
problem is one precise line (game, seq, what the log says, what the rules say). The checks
of one log on its own are the game log's (`services.gamelog.checks`); what is added here is
the comparison of the read models, in their canonical form: strings as stored, hashes and
sorted sets as sorted pairs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgpack

from schemas.codec import unpack_event
from services.bus.clients import QueryClient, log_entries
from services.bus.connection import Client, scan_keys
from services.bus.keys import Keys
from services.bus.stuck import stuck_games
from services.bus.text import as_text, now_ms
from services.gamelog.checks import chain_problems, replay_problems
from services.gamelog.fold import GameFold, fold
from services.projector.models import (
    Kind,
    archived_cells,
    archived_games,
    game_cells,
    game_of_field,
    kept_digest,
    stored_models,
)


@dataclass
class VerifyReport:
    games: int = 0
    events: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class Expected:
    """Read models computed in memory from whole logs: what `verify` expects to find."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.strings: dict[str, bytes] = {}
        self.tables: dict[str, dict[str, Any]] = {}
        self.kinds: dict[str, Kind] = {}

    def add(self, game: GameFold) -> None:
        keys = self.keys
        seen = keys.projector_seen(keys.partition(game.game_id))
        self.kinds[seen] = "hash"
        self.tables.setdefault(seen, {})[game.game_id] = game.seq
        for cell in game_cells(keys, game):
            if cell.value is None:
                continue
            self.kinds[cell.key] = cell.kind
            if cell.kind == "string":
                self.strings[cell.key] = bytes(cell.value)  # type: ignore[arg-type]
            else:
                self.tables.setdefault(cell.key, {})[cell.field] = cell.value


async def verify(
    redis: Client, keys: Keys | None = None, chunk: int = 500, now: int | None = None
) -> VerifyReport:
    """Check every hash chain, replay every log, compare every read model with the logs, and
    find stuck games (as of `now`, default the clock's)."""
    keys = keys or Keys()
    query = QueryClient(redis, keys)
    report = VerifyReport()
    ids = await query.game_ids()
    expected = Expected(keys)
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        pipe = redis.pipeline(transaction=False)
        for gid in part:
            pipe.xrange(keys.log(gid), "-", "+")
        for gid, rows in zip(part, await pipe.execute(), strict=True):
            entries = log_entries(rows)
            report.games += 1
            report.events += len(entries)
            if not entries:
                report.problems.append(f"game {gid}: registered but its log is empty")
                continue
            report.problems.extend(chain_problems(gid, entries))
            report.problems.extend(replay_problems(gid, entries))
            try:
                expected.add(fold(gid, [unpack_event(e.data) for e in entries]))
            except Exception as exc:
                report.problems.append(f"game {gid}: the log does not fold: {exc}")
    orphans = await _unregistered_logs(redis, keys, set(ids))
    report.problems.extend(f"{name}: a log of no registered game" for name in orphans)
    await _archived(redis, keys, set(ids), expected, report)
    stored = await snapshot(redis, keys)
    report.problems.extend(compare_read_models(expected_canonical(expected), stored))
    report.problems.extend(
        f"game {gid}: stuck: playing, its turn past due, and no clock or turn set for it"
        for gid in await stuck_games(redis, keys, now_ms() if now is None else now)
    )
    return report


async def _archived(
    redis: Client, keys: Keys, ids: set[str], expected: Expected, report: VerifyReport
) -> None:
    """Archived games (`agon archive`): none may be registered too, and the results cells
    each keeps (no log in Redis implies them any more) must match the digest recorded when
    it was archived; then they are expected as stored."""
    archived = await archived_games(redis, keys)
    report.problems.extend(
        f"game {gid}: both registered and archived" for gid in sorted(archived.keys() & ids)
    )
    kept = {gid: digest for gid, digest in archived.items() if gid not in ids}
    cells: dict[str, list[tuple[str, str, str]]] = {gid: [] for gid in kept}
    for name, fields in (await archived_cells(redis, keys, kept)).items():
        expected.kinds[name] = "hash"
        expected.tables.setdefault(name, {}).update(fields)
        for cell_field, value in fields.items():
            cells[game_of_field(cell_field)].append((name, cell_field, value))
    report.problems.extend(
        f"game {gid} (archived): its results records differ from those it was archived with"
        for gid, digest in sorted(kept.items())
        if kept_digest(cells[gid]) != digest
    )


async def _unregistered_logs(redis: Client, keys: Keys, ids: set[str]) -> list[str]:
    known = {keys.log(gid) for gid in ids}
    found = [name async for name in scan_keys(redis, keys.log_pattern())]
    return sorted(name for name in found if name not in known)


async def snapshot(redis: Client, keys: Keys | None = None) -> dict[str, bytes]:
    """Every stored read model as canonical bytes (strings as stored; hashes, zsets sorted)."""
    keys = keys or Keys()
    models = await stored_models(redis, keys)
    pipe = redis.pipeline(transaction=False)
    for name, kind in models:
        if kind == "string":
            pipe.get(name)
        elif kind == "hash":
            pipe.hgetall(name)
        else:
            pipe.zrange(name, 0, -1, withscores=True)
    out: dict[str, bytes] = {}
    answers = await pipe.execute(raise_on_error=False)
    for (name, kind), value in zip(models, answers, strict=True):
        if isinstance(value, Exception):  # e.g. WRONGTYPE: someone wrote another type there
            out[name] = msgpack.packb(["unexpected", str(value)])
        elif value:  # a key that vanished between the listing and the read is no model
            out[name] = _canonical(kind, value)
    return out


def expected_canonical(expected: Expected) -> dict[str, bytes]:
    """The read models the logs imply, rendered as `snapshot` renders stored ones."""
    out: dict[str, bytes] = dict(expected.strings)
    for name, table in expected.tables.items():
        kind = expected.kinds[name]
        if kind == "hash":
            out[name] = _canonical("hash", {k: str(v) for k, v in table.items()})
        else:
            out[name] = _canonical("zset", [(m, float(s)) for m, s in table.items()])
    return out


def _canonical(kind: str, value: Any) -> bytes:
    if kind == "string":
        return bytes(value)
    if kind == "hash":
        items = sorted((as_text(k), as_text(v)) for k, v in value.items())
        return msgpack.packb(["hash", items])
    if kind == "zset":
        members = sorted((as_text(m), _score(s)) for m, s in value)
        return msgpack.packb(["zset", members])
    return msgpack.packb(["unexpected", as_text(value)])


def compare_read_models(expected: dict[str, bytes], actual: dict[str, bytes]) -> list[str]:
    """Precise differences between two read-model snapshots, one line each."""
    problems: list[str] = []
    for name in sorted(expected.keys() | actual.keys()):
        want, got = expected.get(name), actual.get(name)
        if want == got:
            continue
        if got is None:
            problems.append(f"{name}: missing (the logs imply it)")
        elif want is None:
            problems.append(f"{name}: present but no log implies it")
        else:
            problems.append(f"{name}: differs: {_difference(want, got)}")
    return problems


def _difference(want: bytes, got: bytes) -> str:
    try:
        a, b = json.loads(want), json.loads(got)
    except ValueError:
        try:
            a, b = msgpack.unpackb(want), msgpack.unpackb(got)
        except Exception:
            return f"expected {want[:200]!r}, stored {got[:200]!r}"
        return f"expected {a}, stored {b}"
    if isinstance(a, dict) and isinstance(b, dict):
        fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        return "; ".join(f"{k}: expected {a.get(k)!r}, stored {b.get(k)!r}" for k in fields)
    return f"expected {a!r}, stored {b!r}"


def _score(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
