"""Every route of the gateway, in one table that both registers them and documents them.

`ROUTES` is the single list: `add_routes` registers each, and `openapi()` builds the
OpenAPI 3.1 document from the same entries and the pydantic models they name, so the
document cannot drift from what the app serves (a test checks both ways).
"""

from __future__ import annotations

import functools
import hmac
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from schemas.api import (
    BoardBody,
    BotKeyBody,
    BotMoveBody,
    BotSettingsBody,
    CatalogueBody,
    ErrorBody,
    GameCreatedBody,
    GamePageBody,
    HealthBody,
    HeldBody,
    MoveBody,
    NewBot,
    NewGame,
    ReadyBody,
    ResignBody,
    SeqBody,
    bot_message_schema,
)
from schemas.tournaments import TournamentSpec
from schemas.views import GameView, PliesBody
from services.gateway import appkeys, bots, games, imports, pages, sockets, tournaments
from services.gateway.http import ApiError, bearer, errors, respond

Handler = Any


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "query" or "path"
    schema: dict[str, Any]
    description: str = ""
    required: bool = False


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    body: type[BaseModel] | None = None
    #: status -> (model, or a media type for a body that is no model, description)
    answers: dict[int, tuple[type[BaseModel] | str | None, str]] = field(default_factory=dict)
    params: tuple[Param, ...] = ()
    tag: str = "games"
    bearer: bool = False


GAME_ID = Param("id", "path", {"type": "string", "pattern": r"^[A-Za-z0-9_.-]{1,64}$"}, "", True)
TOURNAMENT_ID = Param(
    "id", "path", {"type": "string", "pattern": r"^[A-Za-z0-9_-]{1,24}$"}, "", True
)
BOT_NAME = Param("name", "path", {"type": "string", "pattern": r"^[A-Za-z0-9_.-]{1,64}$"}, "", True)
SINCE = Param("since", "query", {"type": "integer", "minimum": 0}, "the last seq already seen")
REFUSED = (ErrorBody, "refused: the code says why")
ASSET = r"^[a-z0-9_-]{1,64}\.(js|css|html)$"
BOARD = r"^[a-z0-9-]{1,32}$"


async def health(request: web.Request) -> web.Response:
    try:
        await request.app[appkeys.QUERY].ping()
        up = True
    except Exception:
        up = False
    body = HealthBody(
        status="ok" if up else "degraded", redis=up, gateway=request.app[appkeys.NAME]
    )
    return respond(request, body.model_dump(), 200 if up else 503)


async def metrics(request: web.Request) -> web.Response:
    if request.app[appkeys.SETTINGS].metrics_port:  # served on a port of their own
        raise ApiError("not_found", "metrics are not served here")
    return await scrape_of(request.app, request)


async def scrape_of(app: web.Application, request: web.Request) -> web.Response:
    """`/metrics` of the gateway `app`, on its own site or on the metrics site: for a
    request bearing the metrics token when one is set."""
    settings = app[appkeys.SETTINGS]
    token = settings.metrics_token
    if token and not hmac.compare_digest(bearer(request).encode(), token.encode()):
        raise ApiError(
            "bad_key", "/metrics needs the metrics token as a bearer (--metrics-token)",
            headers={"WWW-Authenticate": "Bearer"},
        )  # fmt: skip
    data = app[appkeys.METRICS]
    await data.refresh(app[appkeys.QUERY])
    return web.Response(body=data.text(), content_type="text/plain", charset="utf-8")


def metrics_app(main: web.Application) -> web.Application:
    """A site of its own serving only `/metrics` of `main` (`--metrics-port`)."""
    app = web.Application(middlewares=[errors])

    async def metrics(request: web.Request) -> web.Response:
        return await scrape_of(main, request)

    app.router.add_get("/metrics", metrics)
    return app


async def openapi_document(request: web.Request) -> web.Response:
    return web.json_response(openapi())


async def bot_messages_document(request: web.Request) -> web.Response:
    return web.json_response(bot_message_schema())


ROUTES: tuple[Route, ...] = (
    Route(
        "POST", "/api/games", games.create_game,
        "Create a game; a token per human seat (within the address's quota)",
        body=NewGame,
        answers={201: (GameCreatedBody, "created"), 403: REFUSED, 422: REFUSED, 429: REFUSED},
    ),
    Route(
        "GET", "/api/games", games.list_games, "Games, newest first, filtered and paged",
        answers={200: (GamePageBody, "a page of games"), 400: REFUSED},
        params=(
            Param(
                "status", "query",
                {"type": "string", "enum": ["waiting", "playing", "ended", "archived"]},
                "archived: the games in the gateway's --archive directory (agon archive)",
            ),
            Param("game", "query", {"type": "string", "maxLength": 64}),
            Param("player", "query", {"type": "string", "maxLength": 64}),
            Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": games.MAX_PAGE}),
            Param("cursor", "query", {"type": "string", "maxLength": 200}),
        ),
    ),
    Route(
        "GET", "/api/games/{id}", games.get_game, "A game's view (at ply N with ?ply=N)",
        answers={200: (GameView, "the view"), 404: REFUSED},
        params=(GAME_ID, Param("ply", "query", {"type": "integer", "minimum": 0})),
    ),
    Route(
        "GET", "/api/games/{id}/plies", games.get_plies,
        "The views after a range of plies, folded in one pass (replay)",
        answers={200: (PliesBody, "the views, oldest first"), 400: REFUSED, 404: REFUSED},
        params=(
            GAME_ID,
            Param("from_ply", "query", {"type": "integer", "minimum": 0, "maximum": games.MAX_PLY}),
            Param("to_ply", "query", {"type": "integer", "minimum": 0, "maximum": games.MAX_PLY},
                  f"at most {games.PLIES_PER_PAGE - 1} after from_ply"),
        ),
    ),
    Route(
        "POST", "/api/games/{id}/moves", games.play, "Play a move with a seat's token",
        body=MoveBody, params=(GAME_ID,),
        answers={200: (SeqBody, "accepted"), 403: REFUSED, 409: REFUSED, 422: REFUSED},
    ),
    Route(
        "POST", "/api/games/{id}/resign", games.resign, "Resign with a seat's token",
        body=ResignBody, params=(GAME_ID,),
        answers={200: (SeqBody, "accepted"), 403: REFUSED, 409: REFUSED},
    ),
    Route(
        "GET", "/api/games/{id}/events", games.events,
        "The log after `since` (JSON array), or live NDJSON until the game ends",
        params=(GAME_ID, SINCE), answers={200: ("application/json", "events"), 404: REFUSED},
    ),
    Route(
        "GET", "/api/games/{id}/export", games.export_game,
        "The log as stored (jsonl), or a readable game record (text)",
        params=(GAME_ID, Param("format", "query", {"type": "string", "enum": ["jsonl", "text"]})),
        answers={200: ("text/plain", "the export"), 404: REFUSED},
    ),
    Route(
        "POST", "/api/games/import", imports.import_game,
        "Import an exported JSONL log (a registered bot's key, within its quota): verified,"
        " replayed, stored as a new finished game marked imported, never rated",
        bearer=True,
        answers={201: ("application/json", "imported"), 401: REFUSED, 422: REFUSED,
                 429: REFUSED},
    ),
    Route(
        "GET", "/.well-known/agon-export-key", games.export_key,
        "The Ed25519 public key exports are signed with (agon verify-export --key)",
        tag="operations", answers={200: ("application/json", '{"alg": "ed25519", "key": b64}')},
    ),
    Route(
        "POST", "/api/bots", bots.register,
        "Register an outside bot (within the address's quota); its key is shown once",
        body=NewBot, tag="bots",
        answers={201: (BotKeyBody, "registered"), 409: REFUSED, 429: REFUSED},
    ),
    Route(
        "POST", "/api/bots/{name}/key", bots.rotate_key,
        "Rotate the bot's key (send the current one): the new key is shown once, the old one"
        " stops working", params=(BOT_NAME,), tag="bots", bearer=True,
        answers={201: (BotKeyBody, "the new key"), 401: REFUSED, 403: REFUSED},
    ),
    Route(
        "DELETE", "/api/bots/{name}/key", bots.revoke_keys,
        "Revoke every key of the bot (the operator's: the admin token as the bearer)",
        params=(BOT_NAME,), tag="bots", bearer=True,
        answers={200: ("application/json", "how many keys were revoked"), 401: REFUSED},
    ),
    Route(
        "PATCH", "/api/bots/{name}", bots.update_bot,
        "Set the bot's standing settings with its key: whether anyone may seat it in a game",
        body=BotSettingsBody, params=(BOT_NAME,), tag="bots", bearer=True,
        answers={200: ("application/json", "its settings"), 401: REFUSED, 403: REFUSED},
    ),
    Route(
        "GET", "/api/bot/stream", bots.bot_stream,
        "NDJSON turn requests and results for the bot whose key is sent",
        tag="bots", bearer=True, answers={200: (None, "NDJSON stream"), 401: REFUSED},
    ),
    Route(
        "POST", "/api/bot/games/{id}/moves", bots.bot_move, "Answer a turn",
        body=BotMoveBody, params=(GAME_ID,), tag="bots", bearer=True,
        answers={200: (SeqBody, "accepted"), 401: REFUSED, 409: REFUSED, 422: REFUSED},
    ),
    Route(
        "POST", "/api/bot/games/{id}/resign", bots.bot_resign,
        "Resign the bot's seat in a game (no game offers draws by agreement)",
        params=(GAME_ID,), tag="bots", bearer=True,
        answers={200: (SeqBody, "accepted"), 401: REFUSED, 403: REFUSED, 404: REFUSED,
                 409: REFUSED},
    ),
    Route(
        "POST", "/api/bot/ready", bots.bot_ready,
        "Answer a `prepare`: the bot's streams here are ready for the game type",
        body=ReadyBody, tag="bots", bearer=True,
        answers={200: (HeldBody, "the turns released"), 401: REFUSED, 422: REFUSED},
    ),
    Route(
        "GET", "/api/bot/messages.json", bot_messages_document,
        "JSON Schema of every message of a bot's stream (NDJSON) and socket, both ways",
        tag="bots", answers={200: ("application/json", "JSON Schema 2020-12")},
    ),
    Route(
        "GET", "/ws/games/{id}", sockets.game_socket, "WebSocket: live events, and play",
        params=(GAME_ID, SINCE), tag="sockets", answers={101: (None, "switching protocols")},
    ),
    Route(
        "GET", "/ws/bot", bots.bot_socket, "WebSocket: a bot's turns, and its moves",
        tag="sockets", bearer=True, answers={101: (None, "switching protocols")},
    ),
    Route(
        "GET", "/api/tournaments", tournaments.list_tournaments,
        "Tournaments and matches, newest first, paged (ETag: 304 when unchanged)",
        tag="tournaments",
        answers={
            200: ("application/json", "{\"tournaments\": [summary, ...], \"cursor\"}"),
            304: (None, "not modified"), 400: REFUSED,
        },
        params=(
            Param("limit", "query",
                  {"type": "integer", "minimum": 1, "maximum": tournaments.MAX_LIST}),
            Param("cursor", "query", {"type": "integer", "minimum": 0},
                  "the previous page's cursor"),
        ),
    ),
    Route(
        "POST", "/api/tournaments", tournaments.create_tournament,
        "Create a tournament or match (the operator: the admin token as bearer)",
        body=TournamentSpec, tag="tournaments", bearer=True,
        answers={201: ("application/json", "{\"id\"}"), 401: REFUSED, 422: REFUSED},
    ),
    Route(
        "GET", "/api/tournaments/{id}", tournaments.get_tournament,
        "Standings, crosstable, pairs, terminations, health, ratings (and a match's SPRT)",
        params=(TOURNAMENT_ID,), tag="tournaments",
        answers={200: ("application/json", "the report"), 404: REFUSED},
    ),
    Route(
        "GET", "/api/tournaments/{id}/standings.csv", tournaments.standings_file,
        "The standings as CSV", params=(TOURNAMENT_ID,), tag="tournaments",
        answers={200: ("text/csv", "standings"), 404: REFUSED},
    ),
    Route(
        "POST", "/api/tournaments/{id}/cancel", tournaments.cancel_tournament,
        "Cancel a tournament (the operator): its games still going are aborted",
        params=(TOURNAMENT_ID,), tag="tournaments", bearer=True,
        answers={200: ("application/json", "its summary"), 401: REFUSED, 404: REFUSED},
    ),
    Route(
        "GET", "/api/leaderboards/{game}", tournaments.leaderboard,
        "Glicko-2 ratings of the players of a game, per option set; `limit` rows of each "
        "board from `offset` (ETag: 304 when unchanged)", tag="tournaments",
        params=(
            Param("game", "path", {"type": "string", "pattern": BOARD}, "", True),
            Param("limit", "query",
                  {"type": "integer", "minimum": 1, "maximum": tournaments.MAX_BOARD_PAGE}),
            Param("offset", "query", {"type": "integer", "minimum": 0}),
        ),
        answers={
            200: ("application/json", "the boards"), 304: (None, "not modified"),
            400: REFUSED, 404: REFUSED,
        },
    ),
    Route(
        "GET", "/health", health, "Whether the gateway reaches Redis", tag="operations",
        answers={200: (HealthBody, "up"), 503: (HealthBody, "Redis unreachable")},
    ),
    Route(
        "GET", "/metrics", metrics,
        "Prometheus metrics (a bearer with --metrics-token; absent with --metrics-port)",
        tag="operations", answers={200: ("text/plain", "metrics"), 401: REFUSED},
    ),
    Route(
        "GET", "/openapi.json", openapi_document, "This document", tag="operations",
        answers={200: ("application/json", "OpenAPI 3.1")},
    ),
    Route(
        "GET", "/", pages.lobby_page, "The web page: the lobby", tag="page",
        answers={200: ("text/html", "the page")},
    ),
    Route(
        "GET", "/games/{id}", pages.game_page,
        "The web page: a game's board (replay from ply N with ?ply=N)", tag="page",
        params=(
            GAME_ID,
            Param(
                "ply", "query", {"type": "string"},
                "a ply to show; any other text, or a ply the game has not reached, shows the "
                "last one with a note",
            ),
        ),
        answers={200: ("text/html", "the page")},
    ),
    Route(
        "GET", "/tournaments", pages.tournaments_page,
        "The web page: tournaments and matches", tag="page",
        answers={200: ("text/html", "the page")},
    ),
    Route(
        "GET", "/tournaments/{id}", pages.tournaments_page,
        "The web page: a tournament's standings and crosstable, or a match's LLR", tag="page",
        params=(TOURNAMENT_ID,), answers={200: ("text/html", "the page"), 404: REFUSED},
    ),
    Route(
        "GET", "/leaderboards", pages.tournaments_page,
        "The web page: Glicko-2 leaderboards per game", tag="page",
        answers={200: ("text/html", "the page")},
    ),
    Route(
        "GET", "/web/{name}", pages.asset, "The page's modules and style sheet", tag="page",
        params=(Param("name", "path", {"type": "string", "pattern": ASSET}, "", True),),
        answers={200: ("text/*", "the file"), 404: REFUSED},
    ),
    Route(
        "GET", "/api/boards/{name}", pages.board,
        "A board's geometry for drawing: cell outlines and edge coordinates", tag="page",
        params=(Param("name", "path", {"type": "string", "pattern": BOARD}, "", True),),
        answers={200: (BoardBody, "the board"), 404: REFUSED},
    ),
    Route(
        "GET", "/api/catalogue", pages.catalogue,
        "Every game with its options (default first), and every bot a seat can take",
        tag="page", answers={200: (CatalogueBody, "games and bots")},
    ),
)  # fmt: skip


#: A game id in a route: the schema's id alphabet, and never "import" (a route of its own).
ID_ROUTE = "{id:(?!import$)[A-Za-z0-9_.-]{1,64}}"


def add_routes(app: web.Application) -> None:
    for route in ROUTES:
        app.router.add_route(route.method, route.path.replace("{id}", ID_ROUTE), route.handler)


@functools.cache
def openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of `ROUTES` (made once; do not change it)."""
    models = {m for r in ROUTES for m in _models(r)}
    _, defs = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Agon gateway", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {"botKey": {"type": "http", "scheme": "bearer"}},
        },
    }


def _models(route: Route) -> list[type[BaseModel]]:
    found = [m for m, _ in route.answers.values() if isinstance(m, type)]
    return found + ([route.body] if route.body else [])


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _operation(route: Route) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": f"{route.method.lower()}_{route.handler.__name__}",
        "tags": [route.tag],
        "responses": {},
    }
    if route.params:
        op["parameters"] = [
            {"name": p.name, "in": p.where, "required": p.required or p.where == "path",
             "schema": p.schema, **({"description": p.description} if p.description else {})}
            for p in route.params
        ]  # fmt: skip
    if route.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(route.body)}},
        }
    answers: dict[Any, Any] = dict(route.answers)
    answers["default"] = REFUSED  # any route may refuse: 400, 413, 429, 503...
    for status, (model, description) in answers.items():
        answer: dict[str, Any] = {"description": description}
        if isinstance(model, type):
            answer["content"] = {"application/json": {"schema": _ref(model)}}
        elif isinstance(model, str):
            answer["content"] = {model: {"schema": {}}}
        op["responses"][str(status)] = answer
    if route.bearer:
        op["security"] = [{"botKey": []}]
    return op
