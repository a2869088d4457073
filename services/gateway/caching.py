"""Cache headers for the public lists (games, tournaments, leaderboards).

A public list is the same for every caller, so its answer says so: `Cache-Control: public,
max-age=N` (browsers and proxies may reuse it for N seconds) and an `ETag`, a digest of
the bytes sent (so two gateways holding the same data give the same tag); a request whose
`If-None-Match` names the tag gets `304 Not Modified` and no body. `Vary: Accept`, since
the same list goes as JSON or msgpack. The lists stay cheap to build (each is a page of
a read model), so the digest costs no more than the page.
"""

from __future__ import annotations

import hashlib
from typing import Any

from aiohttp import web

from services.gateway.http import respond


def cacheable(request: web.Request, body: Any, *, max_age: int) -> web.Response:
    """`body` as `respond` sends it, with cache headers; 304 when the client holds it."""
    resp = respond(request, body)
    raw = resp.body if isinstance(resp.body, bytes) else b""
    tag = hashlib.blake2b(raw, digest_size=12).hexdigest()
    headers = {"Cache-Control": f"public, max-age={max_age}", "Vary": "Accept"}
    # If-None-Match compares weakly (RFC 9110 13.1.2): a W/ tag matches too.
    if any(held.value in (tag, "*") for held in request.if_none_match or ()):
        not_modified = web.Response(status=304, headers=headers)
        not_modified.etag = tag
        return not_modified
    resp.headers.update(headers)
    resp.etag = tag
    return resp
