"""The import route: an exported game's log as a new finished game, for a registered bot.

An import is the one route that stores a whole game a client wrote, so it is not for
anyone: it takes a registered bot's key (`bots.authenticate`; 401 `bad_key` without one)
and spends that bot's import quota, shared by every gateway (`games.within_quota`; 429
`quota_exceeded`). The file may be signed or not (its signature line is dropped); either
way the engine checks the chain, replays the game and marks it imported
(`services.gamelog.export.rekeyed`), so it is listed and replayable but never counts in ratings,
leaderboards, tournaments or bot health. It lives apart from `games` because `bots`
already reaches `games` (through `sockets`).
"""

from __future__ import annotations

from aiohttp import web

from schemas.base import new_command_id, new_game_id
from services.gamelog import export
from services.gateway.bots import authenticate
from services.gateway.games import within_quota
from services.gateway.http import ApiError, refused, respond, submit


async def import_game(request: web.Request) -> web.Response:
    bot = await authenticate(request)
    await within_quota(request, "import", f"bot:{bot}")
    text = (await request.read()).decode("utf-8", errors="replace")
    try:
        command = export.import_command(text, new_game_id(), new_command_id())
    except ValueError as exc:
        raise ApiError("invalid_import", str(exc)) from None
    reply = await submit(request.app, command)
    if (error := refused(reply)) is not None:
        raise error
    body = {"id": command.game_id, "seq": reply.seq}
    return respond(request, body, 201, Location=f"/api/games/{command.game_id}")
