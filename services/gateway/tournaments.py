"""Tournaments, matches and leaderboards over HTTP.

Reading is open to anyone: the list, one tournament's report (standings, crosstable, pairs,
ratings, a match's SPRT trajectory), its standings as CSV, and the Glicko-2 leaderboards of
a game. Creating and cancelling are the operator's: the request must carry the admin token
(`schemas.tokens.admin_token`, as `agon` prints it) as `Authorization: Bearer TOKEN`.
A director (`agon up` runs one) plays what is created. A gateway whose Redis user may
not write tournament logs (`agon acl`: only the operator and the director may) answers 403.
"""

from __future__ import annotations

from aiohttp import web
from redis.exceptions import NoPermissionError

from engine import game_names
from schemas.tokens import admin_token, tokens_equal
from schemas.tournaments import TOURNAMENT_ID_RE, TournamentSpec, new_tournament_id
from services.bus.consumer import now_ms
from services.gateway import appkeys
from services.gateway.http import ApiError, read_body, respond
from services.tournament.aggregate import Tournament
from services.tournament.director import cancel
from services.tournament.results import (
    game_results,
    leaderboards,
    report,
    standings_csv,
    summary,
    tournament_report,
    tournament_results,
)
from services.tournament.store import TournamentStore

#: Tournaments a list shows.
MAX_LIST = 200


#: What a gateway whose Redis user may not write tournaments says to create or cancel.
READ_ONLY = (
    "this gateway may not write tournaments (its Redis user's rules): run `agon tournament "
    "create` or `cancel` as the operator"
)


def _store(request: web.Request) -> TournamentStore:
    app = request.app
    return TournamentStore(app[appkeys.REDIS], app[appkeys.SETTINGS].keys)


def _operator(request: web.Request) -> None:
    auth = request.headers.get("Authorization", "")
    token = auth.removeprefix("Bearer ").strip()
    if not (auth.startswith("Bearer ") and token):
        raise ApiError("bad_key", "send the admin token as 'Authorization: Bearer TOKEN'")
    if not tokens_equal(token, admin_token(request.app[appkeys.SECRET])):
        raise ApiError("bad_key", "that is not the admin token")


async def _load(request: web.Request) -> Tournament:
    tid = request.match_info["id"]
    t = None
    if TOURNAMENT_ID_RE.fullmatch(tid):
        t = await _store(request).load(tid)
    if t is None:
        raise ApiError("not_found", f"no tournament {tid}")
    return t


async def list_tournaments(request: web.Request) -> web.Response:
    store = _store(request)
    found = await store.load_many(await store.ids(limit=MAX_LIST))
    return respond(request, {"tournaments": [summary(t) for t in found if t is not None]})


async def create_tournament(request: web.Request) -> web.Response:
    _operator(request)
    spec = await read_body(request, TournamentSpec)
    if spec.game not in game_names():
        raise ApiError("invalid_request", f"unknown game {spec.game!r}; known: {game_names()}")
    tid = new_tournament_id()
    try:
        await _store(request).create(tid, spec, now_ms())
    except NoPermissionError:
        raise ApiError("forbidden", READ_ONLY, status=403) from None
    return respond(request, {"id": tid}, 201)


async def get_tournament(request: web.Request) -> web.Response:
    t = await _load(request)
    app = request.app
    return respond(
        request, await tournament_report(app[appkeys.REDIS], app[appkeys.SETTINGS].keys, t)
    )


async def standings_file(request: web.Request) -> web.Response:
    t = await _load(request)
    app = request.app
    results = await tournament_results(app[appkeys.REDIS], app[appkeys.SETTINGS].keys, t)
    return web.Response(
        text=standings_csv(report(t, results)),
        content_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{t.id}-standings.csv"'},
    )


async def cancel_tournament(request: web.Request) -> web.Response:
    _operator(request)
    try:
        t = await cancel(_store(request), (await _load(request)).id)
    except NoPermissionError:
        raise ApiError("forbidden", READ_ONLY, status=403) from None
    return respond(request, summary(t))


async def leaderboard(request: web.Request) -> web.Response:
    game = request.match_info["game"]
    if game not in game_names():
        raise ApiError("not_found", f"no game {game!r}; known: {', '.join(game_names())}")
    app = request.app
    results = await game_results(app[appkeys.REDIS], app[appkeys.SETTINGS].keys, game)
    return respond(request, {"game": game, "boards": leaderboards(results, now_ms())})


__all__ = [
    "cancel_tournament",
    "create_tournament",
    "get_tournament",
    "leaderboard",
    "list_tournaments",
    "standings_file",
]
