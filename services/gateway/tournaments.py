"""Tournaments, matches and leaderboards over HTTP.

Reading is open to anyone: the list, one tournament's report (standings, crosstable, pairs,
ratings, a match's SPRT trajectory), its standings as CSV, and the Glicko-2 leaderboards of
a game. Creating and cancelling are the operator's: the request must carry the admin token
(`schemas.tokens.admin_token`, as `agon` prints it) as `Authorization: Bearer TOKEN`.
A director (`agon up` runs one) plays what is created. A gateway whose Redis user may
not write tournament logs (`agon acl`: only the operator and the director may) answers 403.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from redis.exceptions import NoPermissionError

from engine import game_names
from schemas.tournaments import TOURNAMENT_ID_RE, TournamentSpec, new_tournament_id
from services.bus.text import now_ms
from services.gateway import appkeys
from services.gateway.caching import cacheable
from services.gateway.http import ApiError, int_param, operator, read_body, respond
from services.gateway.leaderboards import Leaderboards
from services.tournament.aggregate import Tournament
from services.tournament.director import cancel
from services.tournament.report import report, report_of, scheduled_results, standings_csv, summary

log = logging.getLogger("agon.gateway")

#: Tournaments a page of the list shows: by default, and at most (each is folded from its
#: log, so a page costs what its tournaments' logs hold).
LIST_PAGE, MAX_LIST = 20, 50
#: Leaderboard rows a page shows per board: by default, and at most.
BOARD_PAGE, MAX_BOARD_PAGE = 100, 500
#: How long a client may reuse a list (seconds): short, since results keep coming.
LIST_MAX_AGE, BOARD_MAX_AGE = 2, 5


#: What a gateway whose Redis user may not write tournaments says to create or cancel.
READ_ONLY = (
    "this gateway may not write tournaments (its Redis user's rules): run `agon tournament "
    "create` or `cancel` as the operator"
)


async def _load(request: web.Request) -> Tournament:
    tid = request.match_info["id"]
    t = None
    if TOURNAMENT_ID_RE.fullmatch(tid):
        t = await request.app[appkeys.TOURNAMENTS].load(tid)
    if t is None:
        raise ApiError("not_found", f"no tournament {tid}")
    return t


async def list_tournaments(request: web.Request) -> web.Response:
    """A page of tournaments, newest first: `limit` (at most MAX_LIST) from `cursor` (the
    previous page's, a position in the list)."""
    limit = int_param(request, "limit", LIST_PAGE, 1, MAX_LIST)
    start = int_param(request, "cursor", 0, 0, 10**9)
    store = request.app[appkeys.TOURNAMENTS]
    ids = await store.ids(limit=limit + 1, offset=start)  # one more: is there a next page?
    found = await store.load_many(ids[:limit])
    body = {
        "tournaments": [summary(t) for t in found if t is not None],
        "cursor": str(start + limit) if len(ids) > limit else None,
    }
    return cacheable(request, body, max_age=LIST_MAX_AGE)


async def create_tournament(request: web.Request) -> web.Response:
    operator(request)
    spec = await read_body(request, TournamentSpec)
    if spec.game not in game_names():
        raise ApiError("invalid_request", f"unknown game {spec.game!r}; known: {game_names()}")
    tid = new_tournament_id()
    try:
        await request.app[appkeys.TOURNAMENTS].create(tid, spec, now_ms())
    except NoPermissionError:
        raise ApiError("forbidden", READ_ONLY, status=403) from None
    return respond(request, {"id": tid}, 201)


async def get_tournament(request: web.Request) -> web.Response:
    t = await _load(request)
    return respond(request, await report_of(request.app[appkeys.QUERY], t))


async def standings_file(request: web.Request) -> web.Response:
    t = await _load(request)
    results = await scheduled_results(request.app[appkeys.QUERY], t)
    return web.Response(
        text=standings_csv(report(t, results)),
        content_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{t.id}-standings.csv"'},
    )


async def cancel_tournament(request: web.Request) -> web.Response:
    operator(request)
    try:
        t = await cancel(request.app[appkeys.TOURNAMENTS], (await _load(request)).id)
    except NoPermissionError:
        raise ApiError("forbidden", READ_ONLY, status=403) from None
    return respond(request, summary(t))


async def leaderboard_cache(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the gateway's `Leaderboards`, its computations cancelled on stop."""
    app[appkeys.LEADERBOARDS] = cache = Leaderboards()
    yield
    with contextlib.suppress(Exception):
        await cache.close()


async def leaderboard(request: web.Request) -> web.Response:
    """A page of the Glicko-2 leaderboards of a game's rules: `limit` rows of every board
    (at most MAX_BOARD_PAGE) from `offset`; each board says its `total` rows."""
    game = request.match_info["game"]
    if game not in game_names():
        raise ApiError("not_found", f"no game {game!r}; known: {', '.join(game_names())}")
    limit = int_param(request, "limit", BOARD_PAGE, 1, MAX_BOARD_PAGE)
    offset = int_param(request, "offset", 0, 0, 10**9)
    app = request.app
    held = await app[appkeys.LEADERBOARDS].boards(app[appkeys.QUERY], game)
    boards = [
        {**b, "rows": b["rows"][offset : offset + limit], "total": len(b["rows"])}
        for b in held.boards
    ]
    more = any(len(b["rows"]) > offset + limit for b in held.boards)
    body = {"game": game, "boards": boards, "offset": offset, "limit": limit}
    body["next"] = offset + limit if more else None
    return cacheable(request, body, max_age=BOARD_MAX_AGE)


__all__ = [
    "cancel_tournament",
    "create_tournament",
    "get_tournament",
    "leaderboard",
    "leaderboard_cache",
    "list_tournaments",
    "standings_file",
]
