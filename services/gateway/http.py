"""What every route shares: bodies in and out, the error shape, commands, rate limits.

Every error a client sees is JSON `{"code", "message"}` (plus the game's `seq` when a
command was refused), one line, with the status the code maps to (`STATUS_OF`); the
gateway never answers a bad request with a traceback. Requests are limited in size, and
per key (a bearer key, or a seat token) and per address in rate (429 with Retry-After).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgpack
from aiohttp import web
from pydantic import BaseModel, ValidationError

from schemas.replies import Rejected, Reply
from schemas.tokens import admin_token, tokens_equal
from services.bus.connection import TRANSIENT_ERRORS, WRITES_REFUSED
from services.gateway import appkeys
from services.gateway.guard import client_address

log = logging.getLogger("agon.gateway")

B = TypeVar("B", bound=BaseModel)

JSON = "application/json"
UNAVAILABLE = "Redis is unavailable; try again shortly"
MSGPACK = "application/msgpack"
NDJSON = "application/x-ndjson"
#: What a request body may be. A browser sends a form (urlencoded, multipart, text/plain)
#: or a body with no type to any site without asking it first, so a page elsewhere could
#: create games and play moves in a visitor's name: JSON routes take only JSON or msgpack,
#: which a cross-site page cannot send without the gateway's consent (CORS preflight).
BODY_TYPES = (JSON, MSGPACK)
#: The import route reads an export as it is: JSONL text (it also needs a bot's key).
TEXT_BODIES: dict[str, tuple[str, ...]] = {
    "/api/games/import": ("application/jsonl", NDJSON, "text/plain", ""),
}

#: HTTP status of each refusal code (the engine's and the gateway's own).
STATUS_OF: dict[str, int] = {
    "invalid_move": 422,
    "illegal_move": 422,
    "invalid_import": 422,
    "invalid_request": 422,
    "unknown_bot": 422,
    "not_your_turn": 409,
    "stale_seq": 409,
    "too_late": 409,
    "game_over": 409,
    "reused_command_id": 409,
    "name_taken": 409,
    "bad_token": 403,
    "not_your_game": 403,
    "forbidden_origin": 403,
    "bad_key": 401,
    "unknown_game": 404,
    "not_found": 404,
    "malformed": 400,
    "bad_request": 400,
    "too_large": 413,
    "unsupported_media_type": 415,
    "rate_limited": 429,
    "timeout": 504,
    "unavailable": 503,
}


class ApiError(Exception):
    """A refusal the client sees as `{"code", "message"[, "seq"]}`."""

    def __init__(
        self,
        code: str,
        message: str,
        seq: int | None = None,
        headers: dict[str, str] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.seq = seq
        self.headers = headers or {}
        self.status = status or STATUS_OF.get(code, 400)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.seq is not None:
            out["seq"] = self.seq
        return out


def operator(request: web.Request) -> None:
    """Refuse a request that does not bear the admin token (`Authorization: Bearer`)."""
    token = bearer(request)
    if not token:
        raise ApiError("bad_key", "send the admin token as 'Authorization: Bearer TOKEN'")
    if not tokens_equal(token, admin_token(request.app[appkeys.SECRET])):
        raise ApiError("bad_key", "that is not the admin token")


def unavailable(exc: Exception) -> ApiError:
    """A 503 with `Retry-After` for a moment Redis cannot serve: away, or refusing writes
    (out of memory) — backpressure, never a 500."""
    if isinstance(exc, WRITES_REFUSED):
        message = "Redis refuses writes for the moment (out of memory or failing over); retry"
        return ApiError("unavailable", message, headers={"Retry-After": "2"})
    return ApiError("unavailable", UNAVAILABLE, headers={"Retry-After": "1"})


def refused(reply: Reply) -> ApiError | None:
    """The refusal a reply means, if it is one."""
    if isinstance(reply, Rejected):
        return ApiError(reply.code, reply.message, reply.seq)
    return None


# -- bodies in, bodies out -------------------------------------------------------------
def respond(request: web.Request, body: Any, status: int = 200, **headers: str) -> web.Response:
    """JSON, or msgpack when the client asks for it with `Accept`; a model (a typed view)
    is serialized by pydantic, in one pass."""
    if MSGPACK in request.headers.get("Accept", ""):
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        return web.Response(
            body=msgpack.packb(body), status=status, content_type=MSGPACK, headers=headers
        )
    if isinstance(body, BaseModel):
        return web.Response(
            body=body.model_dump_json().encode(),
            status=status,
            content_type="application/json",
            headers=headers,
        )
    return web.json_response(body, status=status, headers=headers, dumps=_dumps)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


async def read_body(request: web.Request, model: type[B]) -> B:
    """The request body as `model` (JSON, or msgpack by Content-Type); 4xx when it is not.
    Its media type was checked before the handler ran (`media_types`)."""
    raw = await request.read()
    try:
        data = (
            msgpack.unpackb(raw, raw=False)
            if request.content_type == MSGPACK
            else json.loads(raw or b"null")
        )
    except Exception:
        what = "msgpack" if request.content_type == MSGPACK else "JSON"
        raise ApiError("bad_request", f"the body is not {what}") from None
    return validate(model, data)


def validate(model: type[B], data: Any) -> B:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError("invalid_request", summary(exc)) from None


def summary(exc: ValidationError) -> str:
    """A validation error in one line: each problem's place and message."""
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()[:3]
    ]
    more = exc.error_count() - 3
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError("bad_request", f"{name} must be a whole number, not {text!r}") from None
    if not lo <= value <= hi:
        raise ApiError("bad_request", f"{name} must be between {lo} and {hi}, not {value}")
    return value


async def submit(app: web.Application, command: Any) -> Reply:
    """Send a command through this gateway's command client and return the engine's reply;
    the command's latency and result go to the metrics."""
    started = time.perf_counter()
    try:
        reply = await app[appkeys.COMMANDS].submit(command)
    except TimeoutError:
        app[appkeys.METRICS].count_command("timeout")
        raise ApiError("timeout", "the engine did not answer in time; send it again") from None
    except TRANSIENT_ERRORS as exc:
        raise unavailable(exc) from None
    metrics = app[appkeys.METRICS]
    metrics.latency.observe(time.perf_counter() - started)
    metrics.count_command(getattr(reply, "code", "accepted"))
    return reply


# -- rate limits -----------------------------------------------------------------------
def bearer(request: web.Request) -> str:
    """The token of the request's `Authorization: Bearer TOKEN` ("" when it has none)."""
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth.startswith("Bearer ") else ""


def client_keys(request: web.Request) -> list[str]:
    """Whom a request counts against: its address, and its bearer key if it has one."""
    keys = [f"addr:{client_address(request.remote or '')}"]
    if token := bearer(request):
        keys.append("key:" + token[:16])
    return keys


# -- NDJSON streams --------------------------------------------------------------------
Write = Callable[[bytes], Awaitable[None]]


async def ndjson(
    request: web.Request, kind: str, produce: Callable[[Write], Awaitable[None]]
) -> web.StreamResponse:
    """An NDJSON stream that `produce` writes lines to until it returns or the client goes.
    Once the stream has begun, an error can no longer be a response of its own: it is
    logged in one line and ends the stream (the client reconnects)."""
    response = web.StreamResponse(headers={"Content-Type": NDJSON, "Cache-Control": "no-store"})
    await response.prepare(request)
    gauge = request.app[appkeys.METRICS].streams.labels(kind=kind)
    gauge.inc()
    try:
        await produce(response.write)
    except (ConnectionResetError, asyncio.CancelledError):
        log.debug("%s stream: the client went away", kind)
    except Exception as exc:
        log.warning("%s stream ended by an error: %s", kind, exc)
    finally:
        gauge.dec()
    return response


# -- middlewares -----------------------------------------------------------------------
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal as JSON with a code; a bug as a 500 with its id in the log."""
    try:
        return await handler(request)
    except ApiError as exc:
        return respond(request, exc.body(), exc.status, **exc.headers)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[appkeys.SETTINGS].max_body_bytes
        body = {"code": "too_large", "message": f"the body exceeds {limit} bytes"}
        return respond(request, body, 413)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "bad_request")
        kept = {k: v for k, v in exc.headers.items() if k == "Allow"}
        return respond(request, {"code": code, "message": exc.reason}, exc.status, **kept)
    except asyncio.CancelledError:
        raise
    except ConnectionResetError as exc:
        # The client went away mid-request (or missed a read deadline): nobody reads an
        # answer; one line, not aiohttp's traceback of "Error handling request".
        log.debug("gateway: %s %s: the client went away (%s)", request.method, request.path, exc)
        return web.Response(status=400)
    except TRANSIENT_ERRORS as exc:
        error = unavailable(exc)
        return respond(request, error.body(), error.status, **error.headers)
    except Exception:
        incident = uuid.uuid4().hex[:8]
        log.exception("gateway: %s %s failed (incident %s)", request.method, request.path, incident)
        body = {"code": "internal", "message": f"internal error (incident {incident})"}
        return respond(request, body, 500)


@web.middleware
async def media_types(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A body's media type checked once, before any handler reads it (415 otherwise)."""
    if request.body_exists:
        given = request.content_type if "Content-Type" in request.headers else ""
        accepted = TEXT_BODIES.get(request.path, BODY_TYPES)
        if given not in accepted:
            named = " or ".join(t or "no Content-Type" for t in accepted)
            raise ApiError(
                "unsupported_media_type",
                f"the body must be {named}, not {given or 'without a Content-Type'}",
            )
    return await handler(request)


def limited(request: web.Request) -> float:
    """0 if the request's client may go on (a token spent per key), else seconds to wait."""
    limiter = request.app[appkeys.LIMITER]
    return max(limiter.wait_s(key) for key in client_keys(request))


@web.middleware
async def rate_limit(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path != "/health":  # load balancers probe it often; it costs one PING
        wait = limited(request)
        if wait > 0:
            request.app[appkeys.METRICS].count_command("rate_limited")
            raise ApiError(
                "rate_limited",
                f"too many requests; retry in {wait:.1f} s",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
    return await handler(request)
