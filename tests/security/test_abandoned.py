"""Abandoned games: a client who creates games and leaves them must not hold them for ever.

Issue 22's quota finding: every created game costs Redis ~12 KB, and a game nobody plays
(open seats, or a person who never moves in a game without a clock) stayed `waiting` or
`playing` for good. The dispatcher ends a game nobody touched for `--abandon-after-hours` as
aborted (the platform's end: not scored), so `agon archive` can move it out of Redis.
"""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from services.bus.text import now_ms
from services.dispatcher import Dispatcher
from tests.security.attacks import report
from tests.support.gateway import Arena, new_game, until


async def test_games_nobody_touches_end_as_aborted(arena: Arena, client: TestClient) -> None:
    waiting = await new_game(client, seats=[{"human": {}}, {"human": {"name": "ada"}}])
    playing = await new_game(client, seats=[{"human": {}}, {"human": {}}])
    fresh = Dispatcher(arena.redis, arena.keys, abandon_ms=3_600_000)
    assert await fresh.repair() == 0  # nothing is an hour old
    later = now_ms() + 3_600_000 + 1
    ended = await Dispatcher(
        arena.redis, arena.keys, clock=lambda: later, abandon_ms=3_600_000
    ).repair()
    reasons = [await until(lambda g=g: _reason(client, g["id"])) for g in (waiting, playing)]
    report(
        "abandoned games held for ever",
        ended == 2 and reasons == [("aborted", True)] * 2,
        f"{ended} games nobody touched for an hour ended: {reasons}",
    )
    assert ended == 2 and reasons == [("aborted", True)] * 2


async def _reason(client: Any, gid: str) -> tuple[str, bool] | None:
    view = await (await client.get(f"/api/games/{gid}")).json()
    if view["status"] != "ended":
        return None
    return view["result"]["reason"], "abandoned" in view["result"]["detail"]
