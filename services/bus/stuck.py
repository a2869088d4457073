"""Stuck and abandoned games: playing, and waiting on nothing; or touched by nobody.

A game waits on its seat to move, and the platform keeps something set for that wait: a
clock (the dispatcher's, for a per-move limit), a watch (a bot's turn without a clock) or a
re-check (a claimed clock, claimed again while the game stands). A game with none of them
past its due time would wait for ever: `agon verify` reports it and the dispatcher repairs
it (its turn and clock set again). A game nobody touched for a long time (the dispatcher's
`--abandon-after`, a day by default) is abandoned: it ends as aborted. Read from the game
index and the clock sets only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from schemas.views import StoredView
from services.bus.clients import QueryClient
from services.bus.connection import Client
from services.bus.keys import Keys
from services.bus.text import as_text

#: A game unchanged this long, past its deadline by as much (or a bot to move), with no
#: clock set for its turn is stuck.
STUCK_AFTER_MS = 10_000
#: Views read per page.
PAGE = 200
#: (game id, seq) of a game nobody has touched.
Abandoned = tuple[str, int]


async def stuck_games(redis: Client, keys: Keys, now: int) -> list[str]:
    """Games that wait on nothing: playing, unchanged for `STUCK_AFTER_MS`, the seat to move
    a bot or past its deadline by as much, and no clock, watch or re-check set for the turn
    (`agon verify` reports them; the dispatcher repairs them)."""
    waiting: list[tuple[str, int]] = []
    async for v in views(redis, keys, "playing"):
        seat = v["seats"][v["to_move"] - 1] if v["to_move"] else None
        late = v["deadline"] and now > v["deadline"] + STUCK_AFTER_MS
        idle = now > v["updated"] + STUCK_AFTER_MS
        if seat is not None and idle and (late or seat["kind"] == "bot"):
            waiting.append((v["game_id"], v["seq"]))
    if not waiting:
        return []
    parts = sorted({keys.partition(gid) for gid, _ in waiting})
    pipe = redis.pipeline(transaction=False)
    for p in parts:
        pipe.zrange(keys.clocks(p), 0, -1)
    for gid, _ in waiting:
        pipe.xlen(keys.log(gid))
    answers = await pipe.execute()
    set_for = {
        tuple(as_text(m).split("|")[:2]) for members in answers[: len(parts)] for m in members
    }
    # A view behind its log (a projector that lags) is not a stuck game.
    heads = answers[len(parts) :]
    return [
        gid
        for (gid, seq), head in zip(waiting, heads, strict=True)
        if (gid, str(seq)) not in set_for and int(head) == seq
    ]


async def abandoned_games(redis: Client, keys: Keys, now: int, after_ms: int) -> list[Abandoned]:
    """Games waiting or playing in which nothing happened for `after_ms`: they end as
    aborted (the dispatcher's `repair`), so nobody holds a game, or its keys, for ever."""
    return [
        (v["game_id"], v["seq"])
        for status in ("waiting", "playing")
        async for v in views(redis, keys, status)
        if now > v["updated"] + after_ms
    ]


async def views(redis: Client, keys: Keys, status: str) -> AsyncIterator[StoredView]:
    """Every game view of a status, a page at a time."""
    query = QueryClient(redis, keys)
    cursor: str | None = None
    while True:
        page = await query.games(status=status, limit=PAGE, cursor=cursor)
        for v in page.games:
            yield v
        cursor = page.cursor
        if not cursor or not page.games:
            return
