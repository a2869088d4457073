"""The game routes: create, list, view (at any ply), move, resign, the log, export.

Each turns a request into a command for the engine (through the command client) or a
read (views, logs); the engine alone decides legality, seats and tokens. A human's move
names no seat: the gateway finds the seat whose recorded token hash the token matches,
and otherwise lets the engine refuse it.

A gateway started with an archive (`--archive DIR`, `agon archive`) also serves the games
moved there: `GET /api/games?status=archived` lists them from the archive's index (the list
without a status stays the games in Redis), and a game that is not in Redis is read from its
file for its view (at any ply), replay views, events and export; its view says
`"archived": true`.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from aiohttp import web

from bots.base import bot_names
from schemas.api import BotSeatSpec, GameCreatedBody, GamePageBody, MoveBody, NewGame, ResignBody
from schemas.base import new_command_id, new_game_id
from schemas.codec import unpack
from schemas.commands import CreateGame, PlayMove, Resign, SeatPlayer, SeatSpec
from schemas.replies import Accepted, Reply
from schemas.tokens import token_hash
from schemas.views import GameSummary, PliesBody
from services.archive import ARCHIVED, Archive, ArchiveError, open_archive
from services.bus import quotas
from services.bus.clients import STATUSES, LogEntry
from services.gamelog import export
from services.gamelog.fold import GameFold
from services.gateway import appkeys
from services.gateway.caching import cacheable
from services.gateway.http import (
    NDJSON,
    ApiError,
    Write,
    bearer,
    client_keys,
    int_param,
    ndjson,
    read_body,
    refused,
    respond,
    submit,
)
from services.gateway.live import LiveEvent, follow
from services.gateway.views import api_view, fold_at, start, views_of

MAX_PAGE = 200
#: How long a client may reuse a page of the list (seconds): games come and go.
LIST_MAX_AGE = 2
#: The highest ply a query names; views of a replay per request (`/plies`).
MAX_PLY = 1_000_000
PLIES_PER_PAGE = 50


async def within_quota(request: web.Request, action: str, principal: str) -> None:
    """Take one `action` from `principal`'s quota (shared by every gateway), the size the
    settings give as `<action>_quota`; 429 `quota_exceeded` with Retry-After when spent."""
    settings = request.app[appkeys.SETTINGS]
    quota: quotas.Quota = getattr(settings, f"{action}_quota")
    wait = await quotas.take(request.app[appkeys.REDIS], settings.keys, action, principal, quota)
    if wait > 0:
        who = {"addr": "address", "bot": "bot"}.get(principal.partition(":")[0], "client")
        raise ApiError(
            "quota_exceeded",
            f"this {who}'s {action} quota is spent ({quota.burst} at once, "
            f"{quota.per_hour:g} an hour); retry in {math.ceil(wait)} s",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
            status=429,
        )


async def create_game(request: web.Request) -> web.Response:
    app = request.app
    body = await read_body(request, NewGame)
    seats: list[SeatSpec] = []
    for spec in body.seats:
        if isinstance(spec, BotSeatSpec):
            await check_bot(request, spec.bot)
            seats.append(SeatSpec(kind="bot", name=spec.bot))
        else:
            await check_person(request, spec.human.name)
            seats.append(SeatSpec(kind="human", name=spec.human.name))
    # Creators are anonymous: the quota is their address's (the first of `client_keys`); a
    # game refused for its seats costs none.
    await within_quota(request, "create", client_keys(request)[0])
    game_id = new_game_id()
    create = CreateGame(
        command_id=new_command_id(),
        game_id=game_id,
        game=body.game,
        options=body.options,
        seats=seats,
        move_time_ms=round(body.move_time * 1000) if body.move_time else 0,
        seed=body.seed,
        time_bank_ms=round(body.time_bank * 1000) if body.time_bank else 0,
        on_timeout=body.on_timeout,
    )
    reply = await submit(app, create)
    if (error := refused(reply)) is not None:
        if error.code == "unknown_game":
            error.status = 422  # a game nobody knows how to play, not a missing game id
        raise error
    tokens: list[str | None] = []
    for seat, seat_spec in enumerate(seats, start=1):
        if seat_spec.kind == "bot":
            tokens.append(None)
            continue
        # An anonymous seat keeps no name: it is nobody's to be rated (people, named, are).
        seated = await submit(
            app,
            SeatPlayer(
                command_id=new_command_id(), game_id=game_id, seat=seat, name=seat_spec.name
            ),
        )
        if (error := refused(seated)) is not None:
            raise error
        assert isinstance(seated, Accepted)
        tokens.append(seated.token)
    created = GameCreatedBody(id=game_id, tokens=tokens)
    return respond(request, created.model_dump(), 201, Location=f"/api/games/{game_id}")


async def check_bot(request: web.Request, name: str) -> None:
    """Refuse a seat for a bot nobody could serve (neither built in nor registered), or an
    outside bot that did not consent: the creator bears its key, or it accepts challenges."""
    if name in bot_names():
        return
    app = request.app
    bots = app[appkeys.BOT_REGISTRY]
    record = await bots.record(name)
    if record is None:
        known = ", ".join(bot_names())
        raise ApiError("unknown_bot", f"no bot {name!r}: built in are {known}, or register it")
    if record.get("accept_challenges"):
        return
    key = bearer(request)
    if key and await bots.bot_of(token_hash(key)) == name:
        return
    raise ApiError(
        "bot_consent_required",
        f"{name} plays only in games created with its key (as Bearer), unless it accepts "
        f"challenges (PATCH /api/bots/{name})",
        status=403,
    )


async def check_person(request: web.Request, name: str) -> None:
    """Refuse a person's seat under a bot's name (built in, reserved, or registered, in any
    case): results are kept by name, so a person resigning as "alphabeta" would lose the
    bot's rating for it."""
    app = request.app
    if name and await app[appkeys.BOT_REGISTRY].is_bot_name(name, bot_names()):
        raise ApiError("name_taken", f"{name} is a bot's name; a person plays under another")


async def list_games(request: web.Request) -> web.Response:
    for name, longest in (("game", 64), ("player", 64), ("cursor", 200)):
        if len(request.query.get(name, "")) > longest:
            raise ApiError("bad_request", f"{name} is longer than {longest} characters")
    status = request.query.get("status")
    if status == ARCHIVED:
        return await list_archived(request)
    if status is not None and status not in STATUSES:
        raise ApiError("bad_request", f"status must be one of {', '.join((*STATUSES, ARCHIVED))}")
    try:
        page = await request.app[appkeys.QUERY].games(status=status, **_filters(request))
    except ValueError as exc:
        raise ApiError("bad_request", str(exc)) from None
    body = GamePageBody(games=[GameSummary.of(v) for v in page.games], cursor=page.cursor)
    return cacheable(request, body, max_age=LIST_MAX_AGE)


def _filters(request: web.Request) -> dict[str, Any]:
    """The list filters and page of a request: game, player, limit, cursor."""
    return {
        "game": request.query.get("game") or None,
        "player": request.query.get("player") or None,
        "limit": int_param(request, "limit", 50, 1, MAX_PAGE),
        "cursor": request.query.get("cursor") or None,
    }


async def list_archived(request: web.Request) -> web.Response:
    """Archived games, newest first, from the archive's index (filters and cursor as above)."""
    where = archive_of(request.app)
    if where is None:
        raise ApiError("bad_request", "this gateway serves no archive: start it with --archive DIR")
    try:
        found, cursor = await asyncio.to_thread(where.page, **_filters(request))
    except ValueError as exc:
        raise ApiError("bad_request", str(exc)) from None
    body = GamePageBody(games=[e.summary() for e in found], cursor=cursor)
    return cacheable(request, body, max_age=LIST_MAX_AGE)


def archive_of(app: web.Application) -> Archive | None:
    root = app[appkeys.SETTINGS].archive
    return open_archive(root) if root else None


async def archived_log(app: web.Application, game_id: str) -> list[LogEntry] | None:
    """The log of a game in this gateway's archive (None: no archive, or not in it)."""
    where = archive_of(app)
    if where is None:
        return None
    try:
        return await asyncio.to_thread(where.load, game_id)
    except ArchiveError as exc:
        raise ApiError("archive_damaged", str(exc), status=500) from None


async def game_or_404(request: web.Request, *, fresh: bool = True) -> GameFold:
    """The game of the route, at its log's head (or, not `fresh`, as last folded)."""
    game_id = request.match_info["id"]
    states = request.app[appkeys.STATES]
    game = await (states.current(game_id) if fresh else states.known(game_id))
    if game is None:  # archived games too: nobody plays or follows them any more
        raise ApiError("unknown_game", f"no game {game_id}")
    return game


async def _archived_or_404(request: web.Request) -> list[LogEntry]:
    """The log of the route's game from the archive, the game not being in Redis."""
    game_id = request.match_info["id"]
    entries = await archived_log(request.app, game_id)
    if not entries:
        raise ApiError("unknown_game", f"no game {game_id}")
    return entries


async def get_game(request: web.Request) -> web.Response:
    states = request.app[appkeys.STATES]
    game_id = request.match_info["id"]
    if "ply" in request.query:
        ply = int_param(request, "ply", 0, 0, MAX_PLY)
        game = await states.at_ply(game_id, ply)
        if game is None:
            game = fold_at(await _archived_or_404(request), ply)
            return respond(request, api_view(game, archived=True))
        return respond(request, api_view(game))
    found = await states.current(game_id)
    if found is None:
        found = start(await _archived_or_404(request))
        return respond(request, api_view(found, archived=True))
    return respond(request, api_view(found))


async def get_plies(request: web.Request) -> web.Response:
    """The views after plies `from_ply` to `to_ply` (at most `PLIES_PER_PAGE`), for replay."""
    first = int_param(request, "from_ply", 0, 0, MAX_PLY)
    last = int_param(
        request, "to_ply", first + PLIES_PER_PAGE - 1, first, first + PLIES_PER_PAGE - 1
    )
    game_id = request.match_info["id"]
    views = await request.app[appkeys.STATES].views_between(game_id, first, last)
    if views is None:
        views = views_of(await _archived_or_404(request), first, last)
    return respond(request, PliesBody(views=views))


def seat_of_token(game: GameFold, token: str) -> int:
    """The seat whose recorded token hash `token` matches; else 0 (no seat: the engine
    refuses it with `bad_token`)."""
    hashed = token_hash(token)
    for seat, recorded in game.token_hashes.items():
        if recorded == hashed:
            return seat
    return 0


async def play(request: web.Request) -> web.Response:
    body = await read_body(request, MoveBody)
    game = await game_or_404(request, fresh=False)  # for its seats: the engine checks the rest
    return await _answer(request, game, body.command_id, body.token, move=body.move, seq=body.seq)


async def resign(request: web.Request) -> web.Response:
    body = await read_body(request, ResignBody)
    game = await game_or_404(request, fresh=False)
    return await _answer(request, game, body.command_id, body.token)


async def _answer(
    request: web.Request,
    game: GameFold,
    command_id: str | None,
    token: str,
    *,
    move: str | None = None,
    seq: int = 0,
) -> web.Response:
    reply = await human_command(request.app, game, command_id, token, move, seq)
    if (error := refused(reply)) is not None:
        raise error
    return respond(request, {"seq": reply.seq})


async def human_command(
    app: web.Application,
    game: GameFold,
    command_id: str | None,
    token: str,
    move: str | None,
    seq: int,
) -> Reply:
    """A person's move (or, with no move, resignation), sent and answered."""
    seat = seat_of_token(game, token)
    if not seat:  # seated since this gateway last folded the game?
        game = await app[appkeys.STATES].current(game.game_id) or game
        seat = seat_of_token(game, token) or 1  # the engine refuses a token of no seat
    cid = command_id or new_command_id()
    if move is None:
        command: Any = Resign(command_id=cid, game_id=game.game_id, seat=seat, token=token)
    else:
        command = PlayMove(
            command_id=cid, game_id=game.game_id, seat=seat, token=token, move=move,
            expected_seq=seq,
        )  # fmt: skip
    return await submit(app, command)


# -- the log -----------------------------------------------------------------------------
async def events(request: web.Request) -> web.StreamResponse:
    """The log from `since` + 1 as a JSON array, or as NDJSON that follows the game live
    until it ends (`Accept: application/x-ndjson`)."""
    game = await request.app[appkeys.STATES].current(request.match_info["id"])
    since = int_param(request, "since", 0, 0, 1 << 40)
    if game is None:  # an archived game: all of it, as a live game's that has ended
        later = [e for e in await _archived_or_404(request) if e.seq > since]
        if NDJSON in request.headers.get("Accept", ""):
            lines = "".join(export.export_line(e.data) + "\n" for e in later)
            return web.Response(text=lines, content_type=NDJSON)
        return respond(request, [unpack(e.data) for e in later])
    if NDJSON in request.headers.get("Accept", "") and game.status == "ended" and since >= game.seq:
        return web.Response(body=b"", content_type=NDJSON)  # nothing more will come
    if NDJSON not in request.headers.get("Accept", ""):
        entries = await request.app[appkeys.QUERY].log(game.game_id, since + 1)
        return respond(request, [unpack(e.data) for e in entries])
    return await follow_log(request, game.game_id, since)


async def follow_log(request: web.Request, game_id: str, since: int) -> web.StreamResponse:
    app = request.app
    hub = app[appkeys.HUB]
    listener = hub.listen(game_id)  # before reading the log: nothing falls in between

    async def produce(write: Write) -> None:
        async def send(event: LiveEvent) -> None:
            await write(event.ndjson_line)

        async def keep_alive() -> None:
            await write(b"\n")

        await follow(
            listener, app[appkeys.QUERY], since, send,
            keepalive_s=app[appkeys.SETTINGS].keepalive_s, on_quiet=keep_alive, until_ended=True,
            alive=lambda: request.transport is not None and not request.transport.is_closing(),
        )  # fmt: skip

    try:
        return await ndjson(request, "events", produce)
    finally:
        hub.unlisten(listener)


async def export_game(request: web.Request) -> web.Response:
    game_id = request.match_info["id"]
    fmt = request.query.get("format", "jsonl")
    entries = await request.app[appkeys.QUERY].log(game_id)
    if not entries:
        entries = await _archived_or_404(request)
    if fmt == "jsonl":
        key = export.export_signing_key(request.app[appkeys.SECRET])
        text, kind, suffix = export.export_jsonl(entries, key), "application/jsonl", "jsonl"
    elif fmt == "text":
        text, kind, suffix = export.export_text(entries), "text/plain", "txt"
    else:
        raise ApiError("bad_request", f"format must be jsonl or text, not {fmt!r}")
    disposition = f'attachment; filename="agon-{game_id}.{suffix}"'
    return web.Response(text=text, content_type=kind, headers={"Content-Disposition": disposition})


async def export_key(request: web.Request) -> web.Response:
    """The public key the exports are signed with (`agon verify-export --gateway URL`)."""
    key = export.export_signing_key(request.app[appkeys.SECRET])
    body = {"alg": "ed25519", "key": export.public_key_b64(key)}
    return respond(request, body, 200, **{"Cache-Control": "public, max-age=300"})
