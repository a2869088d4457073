"""The projector: read models folded from the game logs, kept live from the partition feeds.

Three read models, all in the game's partition (one hash tag, so one script writes them):

- the game view (`Keys.view`): JSON of the board, seats, status, seat to move, scores, last
  move, result and, for Supply Chains and Supplier Sabotage, the surplus display (every chain
  with its warehouses, suppliers around and surplus; the deficit warehouses);
- the game index (`Keys.index_*`): zsets of game ids by status, game, player and time, scored
  by creation time;
- per-bot results (`Keys.bot_results`): counters of games, wins, losses, draws and aborts.

A view is a function of its log alone (times come from the events, JSON keys are sorted), so
`rebuild` recomputes byte-identical read models. The projector is idempotent by seq: the
partition's `proj:seen` hash records the last seq projected per game and is written by the
same Lua script as the effect, which also refuses the write if `seen` is not what the
projector folded from, so a redelivered or raced entry cannot apply twice. A projector that
misses events (restart, trimmed feed, a lost race) folds the game again from its log.

Events are read as raw msgpack maps: the engine validated them on the way in, and skipping
pydantic here is what makes `rebuild` fast. `verify` decodes every event fully, checks every
hash chain, replays every log through the engine's checked path and compares the read models
in Redis with the ones recomputed from the logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import multiprocessing
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgpack
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from engine import Game, Move, State, load_game
from schemas.codec import FIELD, FIELD_BYTES, DecodeError, decode_event, unpack
from schemas.events import GameCreated, GameEnded, GameStarted, MovePlayed, PlayerSeated
from services.keys import PROJECTOR_GROUP, Keys
from services.store import LogEntry, chain_problems, connect
from services.streams import Entry, GroupReader, StreamConsumer, as_text, consumer_name

log = logging.getLogger("agon.projector")

#: Version of the view JSON layout; bump when fields change (then `agon rebuild`).
VIEW_VERSION = 1
STATUSES = ("waiting", "playing", "ended")

# -- the atomic write -----------------------------------------------------------------------
# KEYS: seen hash, view, then the keys the ops name (by index into KEYS).
# ARGV: game id, seen the write was folded from, new seen, view bytes, ops...
#   ops: "Z" key score member (ZADD) | "R" key member (ZREM) | "I" key field n (HINCRBY)
# Returns -1 when written, else the seen actually stored (the write was refused).
_APPLY_LUA = """
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if cur ~= tonumber(ARGV[2]) then return cur end
redis.call('SET', KEYS[2], ARGV[4])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
local i = 5
while i <= #ARGV do
  local op, key = ARGV[i], KEYS[tonumber(ARGV[i + 1])]
  if op == 'Z' then
    redis.call('ZADD', key, ARGV[i + 2], ARGV[i + 3]); i = i + 4
  elseif op == 'R' then
    redis.call('ZREM', key, ARGV[i + 2]); i = i + 3
  elseif op == 'I' then
    redis.call('HINCRBY', key, ARGV[i + 2], ARGV[i + 3]); i = i + 4
  else
    return redis.error_reply('unknown op ' .. op)
  end
end
return -1
"""

#: One read-model change besides the view: ("Z", key, score, member), ("R", key, member),
#: ("I", key, field, n).
Op = tuple[Any, ...]


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# -- folding one game -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Summary:
    """What the index and the results depend on; compared before and after a write."""

    status: str
    created: int
    game: str
    players: frozenset[str]
    #: (seat, bot name) of every bot seat
    bots: tuple[tuple[int, str], ...]
    result: int
    reason: str


@dataclass
class GameProjection:
    """One game folded from its events: the engine position plus the facts of the log."""

    game_id: str
    created: dict[str, Any]
    game: Game | None
    state: State | None
    error: str = ""
    seq: int = 0
    status: str = "waiting"
    seats: list[dict[str, Any]] = field(default_factory=list)
    to_move: int = 0
    ply: int = 0
    scores: list[int] | None = None
    last_move: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    updated: int = 0
    #: move text -> action code, shared by every game with the same rules and options
    actions: dict[str, int] = field(default_factory=dict)

    @classmethod
    def start(cls, ev: dict[str, Any]) -> GameProjection:
        """A projection from a `GameCreated` map; an unknown game becomes an error view."""
        if ev.get("type") != "game_created":
            raise ValueError(f"game {ev.get('game_id')}: log starts with {ev.get('type')!r}")
        game: Game | None = None
        state: State | None = None
        actions: dict[str, int] = {}
        error = ""
        try:
            game, actions = _rules(ev["game"], tuple(sorted(ev["options"].items())))
            state = game.new_initial_state()
        except ValueError as exc:
            error = str(exc)
        seats = [
            {"seat": i, "kind": s["kind"], "name": s["name"], "colour": i, "seated": False}
            for i, s in enumerate(ev["seats"], start=1)
        ]
        proj = cls(ev["game_id"], ev, game, state, error, seats=seats, actions=actions)
        if state is not None:
            scores = state.scores()
            proj.scores = None if scores is None else list(scores)
        proj.seq = ev["seq"]
        proj.updated = ev["time"]
        return proj

    def apply(self, ev: dict[str, Any]) -> None:
        """Fold the next event (seq must follow on)."""
        self.extend((ev,))

    def extend(self, events: Iterable[dict[str, Any]]) -> None:
        """Fold the next events, in seq order (each seq must follow on).

        Replaying moves is the bulk of a fold (and of `rebuild`), so a move only goes to the
        engine, through the unchecked action path: the engine checked it before logging it,
        and `verify` checks it again. The facts a move event carries (ply, seat to move,
        scores, colours, last move) are each the newest one's, so only the move before
        another kind of event, or the last one, sets them. A fold that raises midway leaves
        the projection half-updated: callers drop it.
        """
        state = self.state
        actions = self.actions
        seq = self.seq
        last_move: dict[str, Any] | None = None
        ev: dict[str, Any] | None = None
        for ev in events:
            seq += 1
            if ev["seq"] != seq:
                raise ValueError(f"game {self.game_id}: event seq {ev['seq']} after {seq - 1}")
            if ev["type"] == "move_played":
                if state is not None:
                    text = ev["move"]
                    action = actions.get(text)
                    if action is None:
                        action = actions[text] = state.game.action_of(Move.parse(text))
                    state.apply_action(action)
                last_move = ev
                continue
            if last_move is not None:
                self._moved(last_move)
                last_move = None
            self._other(ev)
        if last_move is not None:
            self._moved(last_move)
        if ev is not None:
            self.seq = seq
            self.updated = ev["time"]

    def _other(self, ev: dict[str, Any]) -> None:
        kind = ev["type"]
        if kind == "player_seated":
            seat = self.seats[ev["seat"] - 1]
            seat["name"], seat["kind"], seat["seated"] = ev["name"], ev["kind"], True
        elif kind == "game_started":
            self.status = "playing"
            self.to_move = ev["to_move"]
            self._colours(ev["colours"])
        elif kind == "game_ended":
            self.status = "ended"
            self.to_move = 0
            self.result = {
                "winner": ev["result"],
                "reason": ev["reason"],
                "detail": ev.get("detail", ""),
                "scores": ev["scores"],
            }
            if ev["scores"] is not None:
                self.scores = list(ev["scores"])
        else:
            raise ValueError(f"game {self.game_id}: unexpected event {kind!r} at seq {ev['seq']}")

    def _moved(self, ev: dict[str, Any]) -> None:
        """The facts of a move event, once its move (and every one before) is replayed."""
        self.ply = ev["ply"] + 1
        self.to_move = ev["to_move"]
        self.scores = ev["scores_after"]
        self._colours(ev["colours"])
        self.last_move = {"ply": ev["ply"], "seat": ev["seat"], "move": ev["move"]}

    def _colours(self, colours: Sequence[int]) -> None:
        seats = self.seats
        if seats[0]["colour"] != colours[0] or seats[1]["colour"] != colours[1]:
            for seat, colour in zip(seats, colours, strict=True):
                seat["colour"] = colour

    def view(self) -> dict[str, Any]:
        c = self.created
        move_time = c["move_time_ms"]
        view: dict[str, Any] = {
            "v": VIEW_VERSION,
            "game_id": self.game_id,
            "game": c["game"],
            "options": c["options"],
            "board": self.game.board.name if self.game is not None else "",
            "seats": self.seats,
            "move_time_ms": move_time,
            "seed": c["seed"],
            "engine_version": c["engine_version"],
            "status": self.status,
            "seq": self.seq,
            "ply": self.ply,
            "to_move": self.to_move,
            "position": self.state.board_string() if self.state is not None else "",
            "scores": self.scores,
            "last_move": self.last_move,
            "result": self.result,
            "created": c["time"],
            "updated": self.updated,
            "deadline": self.updated + move_time if move_time and self.status == "playing" else 0,
        }
        if self.error:
            view["error"] = self.error
        state = self.state
        if state is not None:
            if self.to_move and self.seats[self.to_move - 1]["kind"] == "human":
                # People need the legal moves to play; bots compute their own.
                view["legal"] = [str(m) for m in state.legal_moves()]
            display = getattr(state, "display", None)
            if display is not None:
                view["display"] = display().to_dict()
        return view

    def view_bytes(self) -> bytes:
        return _dumps(self.view())

    def summary(self) -> Summary:
        result = self.result or {}
        return Summary(
            status=self.status,
            created=self.created["time"],
            game=self.created["game"],
            players=frozenset(s["name"] for s in self.seats if s["name"]),
            bots=tuple((s["seat"], s["name"]) for s in self.seats if s["kind"] == "bot"),
            result=result.get("winner", 0),
            reason=result.get("reason", ""),
        )


@functools.cache
def _rules(name: str, options: tuple[tuple[str, str], ...]) -> tuple[Game, dict[str, int]]:
    """One `Game` per rules and options (building one costs more than a short game), and
    a memo of its notation: parsing a move is a good part of replaying it."""
    return load_game(name, **dict(options)), {}


def fold(game_id: str, events: Iterable[dict[str, Any]]) -> GameProjection:
    """Fold a whole log's event maps into its projection."""
    it = iter(events)
    first = next(it, None)
    if first is None:
        raise ValueError(f"game {game_id} has an empty log")
    proj = GameProjection.start(first)
    if proj.game_id != game_id:
        raise ValueError(f"the log of game {game_id} belongs to game {proj.game_id}")
    proj.extend(it)
    return proj


def fold_with_summary(
    game_id: str, events: Sequence[dict[str, Any]], at: int = 0
) -> tuple[GameProjection, Summary | None]:
    """Fold a whole log; also the summary as it stood at seq `at` (None if `at` is 0)."""
    if not at:
        return fold(game_id, events), None
    proj = fold(game_id, events[:at])
    before = proj.summary() if proj.seq == at else None
    proj.extend(events[at:])
    return proj, before


def read_model_ops(keys: Keys, game_id: str, before: Summary | None, after: Summary) -> list[Op]:
    """Index and result changes that take the read models from `before` to `after`."""
    p = keys.partition(game_id)
    t = after.created
    ops: list[Op] = []
    if before is None:
        ops.append(("Z", keys.index_time(p), t, game_id))
        ops.append(("Z", keys.index_game(p, after.game), t, game_id))
    if before is None or before.status != after.status:
        if before is not None:
            ops.append(("R", keys.index_status(p, before.status), game_id))
        ops.append(("Z", keys.index_status(p, after.status), t, game_id))
    old_players = before.players if before is not None else frozenset()
    for name in sorted(after.players - old_players):
        ops.append(("Z", keys.index_player(p, name), t, game_id))
    if after.status == "ended" and (before is None or before.status != "ended"):
        for seat, bot in after.bots:
            key = keys.bot_results(p, bot)
            ops.append(("I", key, "games", 1))
            if after.reason == "abort":
                outcome = "aborted"
            elif after.result == 0:
                outcome = "draws"
            else:
                outcome = "wins" if after.result == seat else "losses"
            ops.append(("I", key, outcome, 1))
    return ops


# -- writing --------------------------------------------------------------------------------
class ReadModelWriter:
    """Guarded writes of game views with their index/result changes, pipelined."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self.sha = ""

    def call(
        self, proj: GameProjection, seen: int, ops: Sequence[Op]
    ) -> tuple[list[str], list[Any]]:
        """The script's keys and args for one game's write, folded from stored `seen`."""
        gid = proj.game_id
        p = self.keys.partition(gid)
        script_keys = [self.keys.projector_seen(p), self.keys.view(gid)]
        index: dict[str, int] = {}
        args: list[Any] = [gid, seen, proj.seq, proj.view_bytes()]
        for op in ops:
            key = op[1]
            if key not in index:
                script_keys.append(key)
                index[key] = len(script_keys)
            args.extend((op[0], index[key], *op[2:]))
        return script_keys, args

    async def write(self, calls: Sequence[tuple[list[str], list[Any]]]) -> list[int]:
        """Run the writes in one round trip; per write -1 (done) or the `seen` that refused it."""
        if not calls:
            return []
        if not self.sha:
            self.sha = await self.redis.script_load(_APPLY_LUA)
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(2):
            pipe = self.redis.pipeline(transaction=False)
            for i in todo:
                script_keys, args = calls[i]
                pipe.evalsha(self.sha, len(script_keys), *script_keys, *args)
            raws = await pipe.execute(raise_on_error=False)
            lost = []
            for i, raw in zip(todo, raws, strict=True):
                if isinstance(raw, NoScriptError) and attempt == 0:
                    lost.append(i)  # Redis restarted or flushed scripts: this one did not run
                elif isinstance(raw, Exception):
                    raise raw
                else:
                    results[i] = int(raw)
            if not lost:
                break
            self.sha = await self.redis.script_load(_APPLY_LUA)
            todo = lost
        return results


# -- the live projector ---------------------------------------------------------------------
class Projector(StreamConsumer):
    """Consumes every partition's feed (group `projector`) into the read models.

    `run` and `drain` are `StreamConsumer`'s: an entry that fails on its own is set aside
    to the readers' dead letters, so that it cannot stall the feed.
    """

    def __init__(
        self,
        redis: Redis,
        keys: Keys | None = None,
        *,
        consumer: str | None = None,
        batch: int = 1000,
        block_ms: int = 1000,
        claim_idle_ms: int = 30_000,
        cache_size: int = 20_000,
    ) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self.reader = GroupReader(
            redis,
            [self.keys.feed(p) for p in self.keys.all_partitions()],
            PROJECTOR_GROUP,
            consumer or consumer_name("projector"),
            count=batch,
            claim_idle_ms=claim_idle_ms,
        )
        self.dead_letter = self.keys.reader_dead_letter()
        self.writer = ReadModelWriter(redis, self.keys)
        self.block_ms = block_ms
        self.cache_size = cache_size
        #: events read, game writes done, games folded again from their logs
        self.events = 0
        self.writes = 0
        self.refolds = 0
        self._cache: OrderedDict[str, GameProjection] = OrderedDict()

    def forget(self) -> None:
        """A failed batch may have folded events it never wrote: fold from Redis again."""
        self._cache.clear()

    async def process(self, entries: Sequence[Entry]) -> None:
        by_game: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            try:
                ev = _feed_event(entry)
            except DecodeError as exc:
                # Only the event store writes feeds, so this is corruption to report, not a
                # reason to stop; `agon verify` reads the logs, the source of truth.
                await self.set_aside(entry, exc)
                continue
            self.events += 1
            by_game.setdefault(ev["game_id"], []).append(ev)
        pending = list(by_game)
        for _ in range(3):
            if not pending:
                break
            pending = await self._project(pending, by_game)
        if pending:
            log.warning("projector: %d games kept racing; their next event retries", len(pending))
        await self.reader.ack(entries)

    async def _project(
        self, game_ids: list[str], by_game: dict[str, list[dict[str, Any]]]
    ) -> list[str]:
        """Fold and write the games' new events; return the games whose write was refused."""
        # Which games need their stored `seen` (not cached) and which a fold from the log.
        uncached = [g for g in game_ids if g not in self._cache]
        seen: dict[str, int] = {}
        if uncached:
            pipe = self.redis.pipeline(transaction=False)
            for gid in uncached:
                pipe.hget(self.keys.projector_seen(self.keys.partition(gid)), gid)
            for gid, value in zip(uncached, await pipe.execute(), strict=True):
                seen[gid] = int(value or 0)
        writes: list[tuple[GameProjection, int, list[Op]]] = []
        refold: list[str] = []
        for gid in game_ids:
            events = by_game[gid]
            proj = self._cache.get(gid)
            stored = proj.seq if proj is not None else seen[gid]
            fresh = {ev["seq"]: ev for ev in events if ev["seq"] > stored}
            if not fresh:
                continue  # all projected already (a redelivery)
            if proj is None and stored == 0 and 1 in fresh:
                # A new game whose log so far is all in this batch: no need to read it.
                try:
                    proj = GameProjection.start(fresh.pop(1))
                except Exception:
                    log.exception("projector: game %s does not start", gid)
                    continue
            seqs = sorted(fresh)
            if proj is None or seqs != list(range(proj.seq + 1, proj.seq + 1 + len(seqs))):
                # A miss or a gap (a restart, a trimmed feed): fold the log from the start.
                self._cache.pop(gid, None)
                seen[gid] = stored
                refold.append(gid)
                continue
            before = proj.summary() if stored else None
            try:
                proj.extend(fresh[s] for s in seqs)
            except Exception:
                log.exception("projector: game %s does not fold; dropped from cache", gid)
                self._cache.pop(gid, None)
                continue
            writes.append((proj, stored, read_model_ops(self.keys, gid, before, proj.summary())))
        writes.extend(await self._refold(refold, seen))
        return await self._write(writes)

    async def _refold(self, game_ids: list[str], seen: dict[str, int]) -> list[Any]:
        """Fold games from their logs (a cache miss or a gap) up to the log head."""
        if not game_ids:
            return []
        self.refolds += len(game_ids)
        pipe = self.redis.pipeline(transaction=False)
        for gid in game_ids:
            pipe.xrange(self.keys.log(gid), "-", "+")
        out = []
        for gid, rows in zip(game_ids, await pipe.execute(), strict=True):
            try:
                events = [unpack(fields[FIELD_BYTES]) for _, fields in rows]
                proj, before = fold_with_summary(gid, events, seen[gid])
            except Exception:
                log.exception("projector: the log of game %s does not fold; skipped", gid)
                continue
            if seen[gid] and before is None:
                log.error("projector: game %s: seen %d is beyond its log", gid, seen[gid])
                continue
            out.append((proj, seen[gid], read_model_ops(self.keys, gid, before, proj.summary())))
        return out

    async def _write(self, writes: list[tuple[GameProjection, int, list[Op]]]) -> list[str]:
        results = await self.writer.write([self.writer.call(*w) for w in writes])
        refused: list[str] = []
        for (proj, _, _), result in zip(writes, results, strict=True):
            gid = proj.game_id
            if result != -1:
                # Someone else projected this game meanwhile: fold again from what is stored.
                self._cache.pop(gid, None)
                if result < proj.seq:
                    refused.append(gid)
                continue
            self.writes += 1
            if proj.status == "ended":
                self._cache.pop(gid, None)  # nothing more will happen to it
            else:
                self._cache[gid] = proj
                self._cache.move_to_end(gid)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return refused


def _feed_event(entry: Entry) -> dict[str, Any]:
    """The event map of a feed entry, with the two fields the projector routes by."""
    if entry.data is None:
        raise DecodeError("malformed", f"no field {FIELD!r}")
    ev = unpack(entry.data)
    if not isinstance(ev.get("game_id"), str) or not isinstance(ev.get("seq"), int):
        raise DecodeError("malformed", "no game_id/seq")
    return ev


# -- rebuild, snapshot, verify --------------------------------------------------------------
async def game_ids(redis: Redis, keys: Keys) -> list[str]:
    """Every game id of every partition, partition by partition, in creation order."""
    pipe = redis.pipeline(transaction=False)
    for p in keys.all_partitions():
        pipe.zrange(keys.games(p), 0, -1)
    return [as_text(g) for ids in await pipe.execute() for g in ids]


async def read_logs(redis: Redis, keys: Keys, ids: Sequence[str]) -> list[list[LogEntry]]:
    pipe = redis.pipeline(transaction=False)
    for gid in ids:
        pipe.xrange(keys.log(gid), "-", "+")
    return [
        [LogEntry(int(as_text(eid).split("-", 1)[0]), fields[FIELD_BYTES]) for eid, fields in rows]
        for rows in await pipe.execute()
    ]


async def read_model_keys(redis: Redis, keys: Keys) -> list[str]:
    """Every read-model key of every partition, in one SCAN of the keyspace."""
    first = keys.read_model_pattern(0)
    tag = "{0}"
    patterns = (
        [first.replace(tag, "{*}", 1)]  # every partition's pattern differs only in the tag
        if tag in first
        and first.replace(tag, "", 1) == keys.read_model_pattern(1).replace("{1}", "", 1)
        else [keys.read_model_pattern(p) for p in keys.all_partitions()]
    )
    found: list[str] = []
    for pattern in patterns:
        found.extend([as_text(k) async for k in redis.scan_iter(match=pattern, count=1000)])
    mine = {keys.read_model_pattern(p).split("[", 1)[0] for p in keys.all_partitions()}
    return sorted(k for k in found if k[: k.index("}") + 2] in mine)


async def clear_read_models(redis: Redis, keys: Keys) -> int:
    names = await read_model_keys(redis, keys)
    deleted = 0
    for start in range(0, len(names), 1000):
        deleted += await redis.unlink(*names[start : start + 1000])
    return deleted


@dataclass
class RebuildStats:
    games: int = 0
    events: int = 0
    skipped: list[str] = field(default_factory=list)


class ReadModels:
    """Read models computed in memory from whole logs: what `rebuild` writes, `verify` expects.

    Folding from the start, each game contributes its view, its `seen` seq and the index and
    result changes from nothing to its summary, exactly the effects the live projector adds
    up event by event.
    """

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.strings: dict[str, bytes] = {}
        self.values: dict[str, dict[str, int]] = {}
        self.counters: dict[str, dict[str, int]] = {}
        self.zsets: dict[str, dict[str, int]] = {}

    def add(self, proj: GameProjection) -> None:
        """Add one game's read models; if it raises, nothing of the game was added."""
        gid, keys = proj.game_id, self.keys
        view = proj.view_bytes()
        ops = read_model_ops(keys, gid, None, proj.summary())
        self.strings[keys.view(gid)] = view
        self.values.setdefault(keys.projector_seen(keys.partition(gid)), {})[gid] = proj.seq
        for op in ops:
            if op[0] == "Z":
                self.zsets.setdefault(op[1], {})[op[3]] = op[2]
            elif op[0] == "R":
                self.zsets.get(op[1], {}).pop(op[2], None)
            else:
                counters = self.counters.setdefault(op[1], {})
                counters[op[2]] = counters.get(op[2], 0) + op[3]

    def queue_writes(self, pipe: Any) -> None:
        """Commands adding these read models to the stored ones (counters add up)."""
        if self.strings:
            pipe.mset(self.strings)
        for name, fields in self.values.items():
            pipe.hset(name, mapping=fields)
        for name, fields in self.counters.items():
            for key, n in fields.items():
                pipe.hincrby(name, key, n)
        for name, members in self.zsets.items():
            if members:
                pipe.zadd(name, members)

    def canonical(self) -> dict[str, bytes]:
        """The read models as `snapshot` renders stored ones."""
        out: dict[str, bytes] = dict(self.strings)
        for table in (self.values, self.counters):
            for name, fields in table.items():
                out[name] = _canonical("hash", {k: str(v) for k, v in fields.items()})
        for name, members in self.zsets.items():
            if members:
                out[name] = _canonical("zset", [(m, float(sc)) for m, sc in members.items()])
        return out


async def rebuild(
    redis: Redis,
    keys: Keys | None = None,
    chunk: int = 1000,
    *,
    workers: int = 1,
    url: str = "",
) -> RebuildStats:
    """Delete every read model and recompute it from the logs.

    Partition by partition, in chunks of games, each chunk's read models (views, `seen`,
    index, results: all in the partition's hash slot) go in one MULTI/EXEC, so a crash
    leaves whole games or none. With `workers` > 1 (and the server's `url`), forked
    processes take the partitions in turn: replaying moves is CPU-bound. Run it with the
    projectors stopped (or expect them to refold what they race with).
    """
    keys = keys or Keys()
    await clear_read_models(redis, keys)
    parts = list(keys.all_partitions())
    if workers <= 1 or not url or "fork" not in multiprocessing.get_all_start_methods():
        return await _rebuild_partitions(redis, keys, parts, chunk)
    shares = await _shares(redis, keys, parts, workers)
    loop = asyncio.get_running_loop()
    # Fork, not spawn: the children start at once, with the engine already imported.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        done = await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, _rebuild_in_process, url, keys.prefix, keys.partitions, share, chunk
                )
                for share in shares
            )
        )
    stats = RebuildStats()
    for part in done:
        stats.games += part.games
        stats.events += part.events
        stats.skipped.extend(part.skipped)
    return stats


async def _shares(redis: Redis, keys: Keys, parts: list[int], workers: int) -> list[list[int]]:
    """Partitions dealt to `workers` so that each gets about as many games: biggest first,
    each to the least loaded worker. The whole rebuild waits for the slowest one."""
    pipe = redis.pipeline(transaction=False)
    for p in parts:
        pipe.zcard(keys.games(p))
    sizes = dict(zip(parts, await pipe.execute(), strict=True))
    shares: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for p in sorted(parts, key=lambda p: -sizes[p]):
        i = loads.index(min(loads))
        shares[i].append(p)
        loads[i] += sizes[p]
    return [share for share in shares if share]


def _rebuild_in_process(
    url: str, prefix: str, partitions: int, parts: list[int], chunk: int
) -> RebuildStats:
    async def main() -> RebuildStats:
        redis = connect(url)  # packs commands in C: the writes have many arguments
        try:
            return await _rebuild_partitions(redis, Keys(prefix, partitions), parts, chunk)
        finally:
            await redis.aclose()

    return asyncio.run(main())


async def _rebuild_partitions(
    redis: Redis, keys: Keys, parts: Sequence[int], chunk: int
) -> RebuildStats:
    """Rebuild the read models of `parts`, chunk by chunk of games within a partition.

    Three stages overlap: while one chunk folds (CPU), Redis already reads the next one's
    logs and writes the previous one's read models.
    """
    stats = RebuildStats()
    pipe = redis.pipeline(transaction=False)
    for p in parts:
        pipe.zrange(keys.games(p), 0, -1)
    chunks: list[list[str]] = []
    for members in await pipe.execute():
        ids = [as_text(g) for g in members]
        chunks.extend(ids[i : i + chunk] for i in range(0, len(ids), chunk))
    if not chunks:
        return stats
    raw = _raw_logs_client(redis)
    tasks: list[asyncio.Future[Any]] = []
    with _gc_paused():
        try:
            reading = _start(tasks, _read_raw_logs(raw, keys, chunks[0]))
            writing: asyncio.Future[Any] | None = None
            for i, ids in enumerate(chunks):
                logs = await reading
                if i + 1 < len(chunks):
                    reading = _start(tasks, _read_raw_logs(raw, keys, chunks[i + 1]))
                    await asyncio.sleep(0)  # let it send its commands before the fold
                models = ReadModels(keys)
                for gid, rows in zip(ids, logs, strict=True):
                    try:
                        datas = [_data(fields) for _, fields in rows]
                        models.add(fold(gid, map(unpack, datas)))
                    except Exception as exc:
                        stats.skipped.append(f"game {gid}: {exc}")
                        continue
                    stats.games += 1
                    stats.events += len(datas)
                if writing is not None:
                    await writing
                tx = redis.pipeline(transaction=True)
                models.queue_writes(tx)
                writing = _start(tasks, tx.execute())
            if writing is not None:
                await writing
        finally:
            for task in tasks:
                task.cancel()
    return stats


def _start(tasks: list[asyncio.Future[Any]], work: Any) -> asyncio.Future[Any]:
    task: asyncio.Future[Any] = asyncio.ensure_future(work)
    tasks.append(task)
    return task


def _raw_logs_client(redis: Redis) -> Redis:
    """A client on `redis`'s connections that leaves XRANGE replies as the parser made them.

    redis-py turns every entry into a tuple and a dict; rebuild only wants the bytes.
    """
    raw = Redis(connection_pool=redis.connection_pool)
    raw.set_response_callback("XRANGE", _as_is)
    return raw


def _as_is(response: Any, **options: Any) -> Any:
    return response


async def _read_raw_logs(raw: Redis, keys: Keys, ids: Sequence[str]) -> list[Any]:
    """Each game's log as raw [id, [field, value, ...]] rows, through a `_raw_logs_client`."""
    pipe = raw.pipeline(transaction=False)
    for gid in ids:
        pipe.xrange(keys.log(gid), "-", "+")
    result: list[Any] = await pipe.execute()
    return result


def _data(fields: list[bytes]) -> bytes:
    """Field `m` of a raw entry (the store writes it alone)."""
    if fields[0] == FIELD_BYTES:
        return fields[1]
    for i in range(2, len(fields) - 1, 2):
        if fields[i] == FIELD_BYTES:
            return fields[i + 1]
    raise DecodeError("malformed", f"no field {FIELD!r}")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while folding: a chunk allocates a great many small, acyclic objects,
    and each collection would walk them all again (it doubles the time to decode)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def snapshot(redis: Redis, keys: Keys | None = None) -> dict[str, bytes]:
    """Every read model as canonical bytes (strings as stored; hashes and zsets sorted)."""
    keys = keys or Keys()
    names = await read_model_keys(redis, keys)
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.type(name)
    types = [as_text(t) for t in await pipe.execute()]
    pipe = redis.pipeline(transaction=False)
    for name, kind in zip(names, types, strict=True):
        if kind == "string":
            pipe.get(name)
        elif kind == "hash":
            pipe.hgetall(name)
        elif kind == "zset":
            pipe.zrange(name, 0, -1, withscores=True)
        else:
            pipe.type(name)
    out: dict[str, bytes] = {}
    for name, kind, value in zip(names, types, await pipe.execute(), strict=True):
        out[name] = _canonical(kind, value)
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


def expected_read_models(
    keys: Keys, logs: dict[str, Sequence[LogEntry]]
) -> tuple[dict[str, bytes], list[str]]:
    """The read models that the logs imply, as `snapshot` renders them; and unfoldable logs."""
    models = ReadModels(keys)
    problems: list[str] = []
    for gid, entries in logs.items():
        try:
            models.add(fold(gid, [unpack(e.data) for e in entries]))
        except Exception as exc:
            problems.append(f"game {gid}: the log does not fold: {exc}")
    return models.canonical(), problems


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


def replay_problems(game_id: str, entries: Sequence[LogEntry]) -> list[str]:
    """Replay a log through the engine's checked path; every fact it disagrees with.

    Checks seats and turn order, every move's legality, the recorded scores, colours
    and seat to move, and that the game ends when and as the rules say.
    """
    problems: list[str] = []
    state: State | None = None
    seated: set[int] = set()
    started = ended = False
    for entry in entries:
        where = f"game {game_id} seq {entry.seq}"
        try:
            ev = decode_event(entry.data)
        except DecodeError:
            return problems  # `chain_problems` reports it; nothing after it can be checked
        if ended:
            problems.append(f"{where}: {ev.type} after the game ended")
            continue
        if isinstance(ev, GameCreated):
            if state is not None:
                problems.append(f"{where}: a second game_created")
                continue
            try:
                state = load_game(ev.game, **ev.options).new_initial_state()
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
                return problems
            continue
        if state is None:
            problems.append(f"{where}: {ev.type} before game_created")
            return problems
        if isinstance(ev, PlayerSeated):
            if ev.seat in seated:
                problems.append(f"{where}: seat {ev.seat} seated twice")
            seated.add(ev.seat)
        elif isinstance(ev, GameStarted):
            if seated != {1, 2}:
                problems.append(f"{where}: started with seats {sorted(seated)} taken")
            started = True
            _expect(problems, where, "to_move", ev.to_move, state.seat_to_move)
            _expect(problems, where, "colours", ev.colours, state.seat_colours())
        elif isinstance(ev, MovePlayed):
            if not started:
                problems.append(f"{where}: a move before game_started")
            _expect(problems, where, "seat", ev.seat, state.seat_to_move)
            _expect(problems, where, "colour", ev.colour, state.current_player)
            _expect(problems, where, "ply", ev.ply, state.ply)
            try:
                state.apply(ev.move)
            except ValueError as exc:
                problems.append(f"{where}: move {ev.move!r} rejected by the rules: {exc}")
                return problems
            scores = state.scores()
            _expect(problems, where, "scores_after", ev.scores_after, _list(scores))
            _expect(problems, where, "colours", ev.colours, state.seat_colours())
            _expect(problems, where, "to_move", ev.to_move, state.seat_to_move)
        elif isinstance(ev, GameEnded):
            ended = True
            outcome = state.outcome()
            if ev.reason == "natural":
                if outcome is None:
                    problems.append(f"{where}: natural end but the rules say the game goes on")
                else:
                    winner = state.seat_of(outcome.winner) if outcome.winner else 0
                    _expect(problems, where, "result", ev.result, winner)
                    _expect(problems, where, "scores", ev.scores, _list(outcome.scores))
                    _expect(problems, where, "detail", ev.detail, outcome.reason)
            elif outcome is not None:
                problems.append(f"{where}: {ev.reason} after the rules had ended the game")
    if state is not None and state.is_terminal and not ended:
        problems.append(f"game {game_id}: the rules ended the game but the log has no game_ended")
    return problems


def _list(scores: tuple[int, int] | None) -> list[int] | None:
    return None if scores is None else list(scores)


def _expect(problems: list[str], where: str, name: str, logged: Any, rules: Any) -> None:
    if logged != rules:
        problems.append(f"{where}: {name} is {logged!r} in the log, the rules say {rules!r}")


@dataclass
class VerifyReport:
    games: int = 0
    events: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def verify(redis: Redis, keys: Keys | None = None, chunk: int = 500) -> VerifyReport:
    """Check every hash chain, replay every log, compare every read model with the logs."""
    keys = keys or Keys()
    report = VerifyReport()
    ids = await game_ids(redis, keys)
    logs: dict[str, Sequence[LogEntry]] = {}
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        for gid, entries in zip(part, await read_logs(redis, keys, part), strict=True):
            logs[gid] = entries
            report.games += 1
            report.events += len(entries)
            if not entries:
                report.problems.append(f"game {gid}: registered but its log is empty")
            report.problems.extend(chain_problems(gid, entries))
            report.problems.extend(replay_problems(gid, entries))
    orphans = await _unregistered_logs(redis, keys, set(ids))
    report.problems.extend(f"{name}: a log of no registered game" for name in orphans)
    expected, fold_problems = expected_read_models(keys, logs)
    report.problems.extend(fold_problems)
    report.problems.extend(compare_read_models(expected, await snapshot(redis, keys)))
    return report


async def _unregistered_logs(redis: Redis, keys: Keys, ids: set[str]) -> list[str]:
    known = {keys.log(gid) for gid in ids}
    found = [as_text(k) async for k in redis.scan_iter(match=keys.log_pattern(), count=1000)]
    return sorted(name for name in found if name not in known)


def _score(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
