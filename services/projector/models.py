"""Read models by registry: each declares its keys and what one game contributes to them.

A read model is a function of the game logs. Here each one says, for one folded game,
which cells it owns: a string key, a member of a sorted set or a field of a hash, with
the value it must hold, or `None` when it must be absent (a game that is now `ended` must
not be in the `playing` set). The cells of a game are a complete statement about that game,
so the same write serves the live projector (after each batch), `rebuild` (from the whole
log) and `verify` (what the stored models must equal). A new read model is one more class
in `READ_MODELS`: projected, rebuilt and verified with no further code.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Collection, Iterable
from typing import Literal, NamedTuple, Protocol

from schemas.events import NO_RESULT_REASONS
from schemas.views import ResultRecord
from services.bus.clients import STATUSES
from services.bus.connection import Client, scan_keys
from services.bus.keys import Keys
from services.bus.text import as_text
from services.gamelog.fold import GameFold, dumps

Kind = Literal["string", "zset", "hash"]


def game_of_key(key: str) -> str:
    """The game a string read model's key belongs to: its keys end with ":<game id>"."""
    return key.rpartition(":")[2]


def game_of_field(member: str) -> str:
    """The game a sorted-set member or hash field belongs to: it starts with the game id
    (up to a "|")."""
    return member.partition("|")[0]


class Cell(NamedTuple):
    """One value a read model holds for a game; `value` None means: must be absent."""

    kind: Kind
    key: str
    #: the member (zset) or field (hash) of the game, its game id first (up to a "|",
    #: `game_of_field`); "" for a string key, which ends with ":<game id>" (`game_of_key`)
    field: str
    value: bytes | str | int | None


class ReadModel(Protocol):
    """A read model: its keys (as SCAN patterns, all of one Redis type) and one game's
    cells."""

    name: str
    kind: Kind

    def patterns(self, keys: Keys) -> list[str]:
        """SCAN patterns that match every key of this model in every partition, and no
        key of any other model."""
        ...

    def cells(self, keys: Keys, game: GameFold) -> list[Cell]: ...


class GameViews:
    """`view:<id>`: the game's view as canonical JSON (board, seats, status, scores...)."""

    name = "views"
    kind: Kind = "string"

    def patterns(self, keys: Keys) -> list[str]:
        return [keys.view_pattern()]

    def cells(self, keys: Keys, game: GameFold) -> list[Cell]:
        return [Cell("string", keys.view(game.game_id), "", game.view_bytes())]


class GameIndex:
    """Sorted sets of game ids by status, game, player and time, scored by creation time."""

    name = "index"
    kind: Kind = "zset"

    def patterns(self, keys: Keys) -> list[str]:
        return [keys.index_pattern()]

    def cells(self, keys: Keys, game: GameFold) -> list[Cell]:
        gid = game.game_id
        p = keys.partition(gid)
        t = game.created["time"]
        out = [
            Cell("zset", keys.index_time(p), gid, t),
            Cell("zset", keys.index_game(p, game.created["game"]), gid, t),
        ]
        for status in STATUSES:
            value = t if status == game.status else None
            out.append(Cell("zset", keys.index_status(p, status), gid, value))
        for name in sorted({s["name"] for s in game.seats if s["name"]}):
            out.append(Cell("zset", keys.index_player(p, name), gid, t))
        return out


def imported(game: GameFold) -> bool:
    """Whether a game was imported (`ImportGame`): the engine marks its `GameCreated`
    (`services.gamelog.export.rekeyed`), whatever the file said. An import proves only that someone
    holds a log that chains and replays, not that the game was played here: it never counts
    in the competition read models (results, ratings, leaderboards, tournaments, bot health),
    and its cells there are stated absent, so a rebuild also drops any recorded before."""
    return "imported_from" in game.created


class BotResults:
    """`botresults:<bot>`: per bot, each finished game's outcome for it (field "<id>|<seat>":
    a bot may hold both seats); never an imported game's (`imported`)."""

    name = "bot-results"
    kind: Kind = "hash"

    def patterns(self, keys: Keys) -> list[str]:
        return [keys.bot_results_pattern()]

    def cells(self, keys: Keys, game: GameFold) -> list[Cell]:
        p = keys.partition(game.game_id)
        out = []
        for seat in game.seats:
            if seat["kind"] != "bot":
                continue
            counted = game.status == "ended" and not imported(game)
            outcome = _outcome(game, seat["seat"]) if counted else None
            cell_field = f"{game.game_id}|{seat['seat']}"
            out.append(Cell("hash", keys.bot_results(p, seat["name"]), cell_field, outcome))
        return out


def _outcome(game: GameFold, seat: int) -> str:
    result = game.result
    if result is None or result["reason"] in NO_RESULT_REASONS:
        return "aborted"
    if result["winner"] == 0:
        return "draws"
    return "wins" if result["winner"] == seat else "losses"


def result_record(game: GameFold) -> str:
    """A finished game's result as the competition read models keep it (canonical JSON;
    `services.tournament.report.parse_record` reads it back)."""
    result = game.result
    created = game.created
    first, second = (s["name"] for s in game.seats)
    record = ResultRecord(
        game_id=game.game_id,
        game=created["game"],
        options=sorted(created["options"].items()),
        players=(first, second),
        people=[s["seat"] for s in game.seats if s["kind"] == "human"] or None,
        winner=result["winner"] if result else 0,
        reason=result["reason"] if result else "",
        fault=result.get("fault", 0) if result else 0,
        ended=game.updated,
        think_ms=game.think,
        lag_ms=game.lag if any(any(seat) for seat in game.lag) else None,
        tournament=created.get("tournament"),
    )
    return dumps(record.model_dump(mode="json", exclude_none=True)).decode()


class Results:
    """Finished games' result records, for leaderboards and ratings (`results:<game>`, every
    game with both seats named: an anonymous person's seat has no name, so no rating) and
    for tournaments (`tresults:<tournament>`); never an imported game's (`imported`)."""

    name = "results"
    kind: Kind = "hash"

    def patterns(self, keys: Keys) -> list[str]:
        return [keys.results_pattern(), keys.tournament_results_pattern()]

    def cells(self, keys: Keys, game: GameFold) -> list[Cell]:
        p = keys.partition(game.game_id)
        gid = game.game_id
        named = all(s["name"] for s in game.seats)
        tournament = game.created.get("tournament")
        if not named and tournament is None:
            return []
        counted = game.status == "ended" and not imported(game)
        record = result_record(game) if counted else None
        out = []
        if named:
            out.append(Cell("hash", keys.results(p, game.created["game"]), gid, record))
        if tournament is not None:
            out.append(Cell("hash", keys.tournament_results(p, tournament), gid, record))
        return out


#: Every read model. The projector's own bookkeeping (`proj:seen`) is kept beside them.
READ_MODELS: list[ReadModel] = [GameViews(), GameIndex(), BotResults(), Results()]

#: The read models whose cells a game keeps when `agon archive` moves its log out of Redis:
#: the competition history (standings, ratings), small, and read without the log. The
#: archived games are listed per partition (`Keys.archived`) with a digest of those cells
#: (`kept_digest`): rebuild leaves the cells alone, and verify, which no log in Redis tells
#: what they should be any more, checks them against the digest.
KEPT_WHEN_ARCHIVED = frozenset({BotResults.name, Results.name})


def kept_patterns(keys: Keys) -> list[str]:
    """SCAN patterns of the read models an archived game keeps."""
    return [p for m in READ_MODELS if m.name in KEPT_WHEN_ARCHIVED for p in m.patterns(keys)]


def kept_cells(keys: Keys, game: GameFold) -> list[tuple[str, str, str]]:
    """The cells a game keeps when archived, as (key, field, value)."""
    return [
        (cell.key, cell.field, _as_str(cell.value))
        for model in READ_MODELS
        if model.name in KEPT_WHEN_ARCHIVED
        for cell in model.cells(keys, game)
        if cell.value is not None
    ]


def _as_str(value: bytes | str | int) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def kept_digest(cells: Iterable[tuple[str, str, str]]) -> str:
    """A short digest of an archived game's kept cells (key, field, value)."""
    digest = hashlib.sha1()
    for key, cell_field, value in sorted(cells):
        digest.update(f"{key}\0{cell_field}\0{value}\n".encode())
    return digest.hexdigest()[:16]


async def archived_games(redis: Client, keys: Keys) -> dict[str, str]:
    """Every archived game id, with the digest of the cells it keeps."""
    pipe = redis.pipeline(transaction=False)
    for p in keys.all_partitions():
        pipe.hgetall(keys.archived(p))
    return {as_text(g): as_text(d) for games in await pipe.execute() for g, d in games.items()}


async def archived_cells(
    redis: Client, keys: Keys, archived: Collection[str]
) -> dict[str, dict[str, str]]:
    """The stored cells of the kept read models that belong to archived games: hash key ->
    field -> value."""
    if not archived:
        return {}
    kept = kept_patterns(keys)
    names = [
        name
        for name, kind in await stored_models(redis, keys)
        if kind == "hash" and any(fnmatch.fnmatchcase(name, p) for p in kept)
    ]
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(name)
    out: dict[str, dict[str, str]] = {}
    for name, table in zip(names, await pipe.execute() if names else [], strict=True):
        fields = {as_text(k): as_text(v) for k, v in table.items()}
        mine = {k: v for k, v in fields.items() if game_of_field(k) in archived}
        if mine:
            out[name] = mine
    return out


def all_patterns(keys: Keys) -> list[tuple[str, Kind]]:
    """SCAN patterns, with their keys' type, of every read model and of the projector's
    bookkeeping."""
    models = [(pattern, m.kind) for m in READ_MODELS for pattern in m.patterns(keys)]
    return [(keys.projector_seen_pattern(), "hash"), *models]


async def stored_models(redis: Client, keys: Keys) -> list[tuple[str, Kind]]:
    """Every stored read-model key (on every node) with its type, sorted by name.

    One SCAN of the partitions' keys, matched here against every model's patterns: a
    SCAN walks the whole keyspace whatever its pattern, so one walk instead of one a model.
    """
    patterns = all_patterns(keys)
    found: dict[str, Kind] = {}
    async for name in scan_keys(redis, keys.any_partition("*")):
        for pattern, kind in patterns:
            if fnmatch.fnmatchcase(name, pattern):
                found[name] = kind
                break
    return sorted(found.items())


def game_cells(keys: Keys, game: GameFold) -> list[Cell]:
    return [cell for model in READ_MODELS for cell in model.cells(keys, game)]
