"""The guarded write of the read models: a game's cells, written only over what their writer
folded from.

Every write of a game's cells is one Lua script in the game's partition (all its keys
carry the `{p}` tag) that also records the seq the cells were folded to (`proj:seen`),
and refuses the write unless the stored seq is in the range the writer folded from: the
live projector writes only on top of exactly what it folded (`lo == hi == seen`), rebuild
only where the stored models are not ahead of its fold (`0 <= seen <= seq`). Nothing is a
counter, so a write never depends on what it replaces: rebuilding while play goes on, or
writing the same cells twice, leaves the right models.

A live projector that divides the partitions with others (`services.bus.ownership`) also
names the epoch of the partition's lease it holds (`fence`): once another projector holds
the lease, the call writes nothing, so one paused past its lease cannot write over its
successor when it resumes.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
from redis.asyncio import Redis
from redis.exceptions import WatchError

from services.bus.connection import Client
from services.bus.keys import PROJECTOR_GROUP, Keys
from services.bus.scripts import Script
from services.bus.text import as_text
from services.gamelog.fold import GameFold
from services.projector.models import Cell, Kind, game_cells

# -- the guarded write ---------------------------------------------------------------------
# One call writes several games of one partition, each on its own terms, with one command
# per key rather than one per cell: the guards are read in one HMGET, then each key gets
# one ZADD/ZREM/HSET/HDEL with the members of the games whose guard held (a view, one
# SET or DEL each), then the seen hash one HSET.
# KEYS: every key the call names, the partition's seen hash first, the projectors' lease
#   of the partition second.
# ARGV[1]: msgpack of [fence, ids, lo, hi, new seens, groups, heads]: the fence is the
#   lease epoch the writer holds (0: not checked), each group [command, key index (into
#   KEYS), the game index (1..n) of each item, the items' arguments, flat]: a SET item is
#   its value, DEL none, ZADD score and member, ZREM a member, HSET field and value, HDEL
#   a field; each head [key index of the game's log, sha1 of the bytes of its entry `new
#   seen`] or [0] (not checked). One packed argument instead of thousands keeps
#   both the client's encoding and the script's argument handling cheap; when every guard
#   held (rebuild, and the live projector almost always) each group's arguments go to
#   Redis as they came.
# Returns per game -1 when written, else the stored seen that refused it; or, when the
# fence is not the lease's epoch (another projector owns the partition now), -2 (`FENCED`)
# for every game, and nothing is written.
_WRITE = Script(
    """
local d = cmsgpack.unpack(ARGV[1])
local fence, ids, lo, hi, new, groups, heads = d[1], d[2], d[3], d[4], d[5], d[6], d[7]
local n = #ids
if fence ~= 0 and tonumber(redis.call('HGET', KEYS[2], 'epoch') or '0') ~= fence then
  local out = {}
  for g = 1, n do out[g] = -2 end
  return out
end
local stored = redis.call('HMGET', KEYS[1], unpack(ids))
-- Whether this server's log holds the very event the fold ended with: after a failover
-- it may hold another event of that seq, or none, and models of a lost event are wrong.
local function holds(g)
  local head = heads[g]
  if head[1] == 0 then return true end
  local at = string.format('%d-0', new[g])
  local entry = redis.call('XRANGE', KEYS[head[1]], at, at)[1]
  return entry ~= nil and redis.sha1hex(entry[2][2]) == head[2]
end
local ok, out, seen, all = {}, {}, {}, true
for g = 1, n do
  local cur = tonumber(stored[g] or '0')
  if cur >= lo[g] and cur <= hi[g] and holds(g) then
    ok[g] = true
    out[g] = -1
    seen[#seen + 1] = ids[g]
    seen[#seen + 1] = new[g]
  else
    out[g] = cur
    all = false
  end
end
local width = {SET = 1, DEL = 0, ZADD = 2, ZREM = 1, HSET = 2, HDEL = 1}
for _, group in ipairs(groups) do
  local op, key, games, args = group[1], KEYS[group[2]], group[3], group[4]
  local any = all
  if not all then
    local w = width[op]
    if not w then return redis.error_reply('unknown command ' .. op) end
    local kept = {}
    for j, g in ipairs(games) do
      if ok[g] then
        any = true
        for k = (j - 1) * w + 1, j * w do kept[#kept + 1] = args[k] end
      end
    end
    args = kept
  end
  if any then
    if op == 'SET' then redis.call('SET', key, args[#args])
    elseif op == 'DEL' then redis.call('DEL', key)
    else redis.call(op, key, unpack(args)) end
  end
end
if #seen > 0 then redis.call('HSET', KEYS[1], unpack(seen)) end
return out
"""
)
#: Games per script call: enough to amortise the call, few enough not to stall the server.
WRITES_PER_CALL = 64
#: A game's answer when its partition's lease is another projector's: no stored seen (>= 0)
#: and not "written" (-1).
FENCED = -2

_OPS: dict[tuple[Kind, bool], str] = {
    ("string", True): "SET",
    ("string", False): "DEL",
    ("zset", True): "ZADD",
    ("zset", False): "ZREM",
    ("hash", True): "HSET",
    ("hash", False): "HDEL",
}


@dataclass(frozen=True, slots=True)
class Write:
    """One game's cells, to be written if the stored seen lies in [lo, hi].

    `since` holds the cells this fold last wrote (the live projector keeps them with its
    cached fold): then only cells that changed are sent, usually the view alone. The guard
    makes that safe: the stored models are exactly what that earlier write left.
    `head`, when given, is the sha1 (hex) of the bytes of the log entry the fold ended with
    (`head_of`): the write is refused too unless the server's log holds that very entry.
    """

    game: GameFold
    lo: int
    hi: int
    since: dict[tuple[str, str], Any] | None = None
    head: str = ""


def head_of(data: bytes) -> str:
    """A log entry's identity for `Write.head`: the sha1 of its bytes, as Lua computes it."""
    return hashlib.sha1(data).hexdigest()


Groups = dict[tuple[str, str], tuple[list[int], list[Any]]]


def _groups(writes: Sequence[Write], cells: Sequence[Sequence[Cell]]) -> Groups:
    """The cells to write, one group per (command, key), in first-seen order: the game
    (1..n) of each item, and the items' arguments, flat (see `_WRITE`)."""
    groups: Groups = {}
    for g, (w, game_cells_) in enumerate(zip(writes, cells, strict=True), start=1):
        since = w.since
        for cell in game_cells_:
            if since is not None and since.get((cell.key, cell.field), _ABSENT) == cell.value:
                continue
            op = _OPS[cell.kind, cell.value is not None]
            games, args = groups.setdefault((op, cell.key), ([], []))
            games.append(g)
            if op == "ZADD":
                args += (cell.value, cell.field)
            elif op == "HSET":
                args += (cell.field, cell.value)
            elif op == "SET":
                args.append(cell.value)
            elif cell.field:  # ZREM, HDEL
                args.append(cell.field)
    return groups


def _call(
    keys: Keys,
    p: int,
    writes: Sequence[Write],
    cells: Sequence[Sequence[Cell]],
    fence: Callable[[int], int] | None,
) -> tuple[list[str], list[Any]]:
    """One script call for games of partition `p`: its keys and its one argument."""
    script_keys = [keys.projector_seen(p), keys.lease(p, PROJECTOR_GROUP)]
    index = {key: i for i, key in enumerate(script_keys, start=1)}

    def at(key: str) -> int:
        if key not in index:
            script_keys.append(key)
            index[key] = len(script_keys)
        return index[key]

    groups = _groups(writes, cells)
    for _, key in groups:
        at(key)
    heads = [[at(keys.log(w.game.game_id)), w.head] if w.head else [0] for w in writes]
    packed = msgpack.packb(
        [
            fence(p) if fence is not None else 0,
            [w.game.game_id for w in writes],
            [w.lo for w in writes],
            [w.hi for w in writes],
            [w.game.seq for w in writes],
            [[op, index[key], games, args] for (op, key), (games, args) in groups.items()],
            heads,
        ],
        use_bin_type=False,  # Redis's cmsgpack reads no bin type: bytes go as (raw) str
    )
    return script_keys, [packed]


async def _watched(
    redis: Redis,
    keys: Keys,
    p: int,
    writes: Sequence[Write],
    cells: Sequence[Sequence[Cell]],
    *,
    between: Callable[[], Awaitable[None]] | None = None,
) -> list[int] | None:
    """`_WRITE`'s work as an optimistic transaction: plain commands, no script (a script
    copies every view into Lua, which costs Redis more than the writes themselves).

    The partition's seen hash is WATCHed while the guards are read, so any other write of
    the partition's models in between (each sets that hash) aborts the transaction:
    then None, and nothing was written. (`between` runs once the guards are read: a test
    writes there.)
    """
    assert not any(w.head for w in writes), "heads are checked by the script only"
    seen_key = keys.projector_seen(p)
    ids = [w.game.game_id for w in writes]
    async with redis.pipeline(transaction=True) as pipe:
        await pipe.watch(seen_key)
        stored = [int(s or 0) for s in await pipe.hmget(seen_key, ids)]
        out = [-1 if w.lo <= s <= w.hi else s for w, s in zip(writes, stored, strict=True)]
        ok = [i for i, r in enumerate(out) if r == -1]
        if not ok:
            return out
        if between is not None:
            await between()
        pipe.multi()  # type: ignore[no-untyped-call]
        for (op, key), (_, args) in _groups(
            [writes[i] for i in ok], [cells[i] for i in ok]
        ).items():
            if op == "SET":
                pipe.set(key, args[-1])
            elif op == "DEL":
                pipe.delete(key)
            else:
                pipe.execute_command(op, key, *args)
        pipe.hset(seen_key, mapping={ids[i]: writes[i].game.seq for i in ok})
        try:
            await pipe.execute()
        except WatchError:
            return None
    return out


_ABSENT = object()


def cell_values(cells: Sequence[Cell]) -> dict[tuple[str, str], Any]:
    """The cells as (key, field) -> value: what a later `Write.since` compares with."""
    return {(cell.key, cell.field): cell.value for cell in cells}


async def write(
    redis: Any,
    keys: Keys,
    writes: Sequence[Write],
    *,
    written: bool = False,
    optimistic: bool = False,
    fence: Callable[[int], int] | None = None,
) -> list[tuple[int, dict[tuple[str, str], Any] | None]]:
    """The writes in one round trip; per write -1 (done), the seen that refused it or
    `FENCED`, and (with `written`) the game's cells as now written, for the next write's
    `since`.

    `fence` gives per partition the epoch of its projectors' lease the writer holds (the
    live projector's `StreamConsumer.fence`); None or 0: not checked (rebuild).

    With `optimistic` (many games per partition, rarely written by anyone else: rebuild),
    a single server gets each partition's games as one watched transaction (`_watched`:
    three round trips; rebuild's chunk of a thousand games holds the server about 8 ms),
    and only those another write interrupted go through the script.
    """
    assert fence is None or not optimistic, "a watched transaction checks no fence"
    if not writes:
        return []
    cells = [game_cells(keys, w.game) for w in writes]
    by_partition: dict[int, list[int]] = {}
    for i, w in enumerate(writes):
        by_partition.setdefault(keys.partition(w.game.game_id), []).append(i)

    def part(call: list[int]) -> tuple[int, list[Write], list[list[Cell]]]:
        p = keys.partition(writes[call[0]].game.game_id)
        return p, [writes[i] for i in call], [cells[i] for i in call]

    calls: list[list[int]] = []
    answers: list[Any] = []
    todo = list(by_partition.values())
    if optimistic and isinstance(redis, Redis):
        # One transaction per partition (each sets the seen hash the others would watch),
        # the partitions side by side.
        watched = await asyncio.gather(*(_watched(redis, keys, *part(c)) for c in todo))
        calls = [c for c, answer in zip(todo, watched, strict=True) if answer is not None]
        answers = [answer for answer in watched if answer is not None]
        todo = [c for c, answer in zip(todo, watched, strict=True) if answer is None]
    scripted = [c[i : i + WRITES_PER_CALL] for c in todo for i in range(0, len(c), WRITES_PER_CALL)]
    if scripted:
        answers += await _WRITE.run_many(redis, [_call(keys, *part(c), fence) for c in scripted])
        calls += scripted
    out: list[tuple[int, dict[tuple[str, str], Any] | None]] = [(0, None)] * len(writes)
    for call, answer in zip(calls, answers, strict=True):
        for i, result in zip(call, answer, strict=True):
            out[i] = (int(result), cell_values(cells[i]) if written else None)
    return out


# Whether a partition's read models hold the games up to the seqs given, and a write that
# a WAIT after it covers: the seen hash's first field written again with its own value. A
# WAIT waits for its connection's last write, and every earlier write of this server (the
# models' among them, whichever connection sent them) came before it.
# KEYS[1]: the partition's seen hash. ARGV: game id, seq, game id, seq, ...
# Returns the ids whose stored seen is below the seq given.
_CONFIRM = Script(
    """
local short = {}
for i = 1, #ARGV, 2 do
  if tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') < tonumber(ARGV[i + 1]) then
    short[#short + 1] = ARGV[i]
  end
end
local first = redis.call('HGET', KEYS[1], ARGV[1])
if first then redis.call('HSET', KEYS[1], ARGV[1], first) end
return short
"""
)


async def unconfirmed(
    redis: Client, keys: Keys, seqs: Mapping[str, int], replicas: int, timeout_ms: int
) -> list[str]:
    """The games whose read models the server that now serves their partition does not
    hold up to the seq given, or holds without `replicas` replicas confirming it (WAIT,
    on the same connection as the check: after a failover, the models written to the dead
    master are not confirmed by the new one's replicas)."""
    by_partition: dict[int, list[str]] = {}
    for gid in seqs:
        by_partition.setdefault(keys.partition(gid), []).append(gid)
    parts = list(by_partition.items())
    calls = [
        ([keys.projector_seen(p)], [x for gid in ids for x in (gid, seqs[gid])]) for p, ids in parts
    ]
    answers = await _CONFIRM.run_replicated(redis, calls, replicas, timeout_ms)
    out: list[str] = []
    for (_, ids), (short, confirmed) in zip(parts, answers, strict=True):
        out += ids if not confirmed else [as_text(gid) for gid in short]
    return out
