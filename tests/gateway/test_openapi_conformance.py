"""An OpenAPI conformance run (schemathesis) over a live gateway and the whole pipeline.

Schemathesis generates requests from `/openapi.json` (the document the routes table makes)
and checks every answer: no server error, a documented status, content type and body
schema (every check but `positive_data_acceptance`: see the test). The arena runs as
`agon up` in its own process on this session's redis-server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from services.bus.embedded import EmbeddedRedis, free_port
from services.gateway.routes import openapi
from tests.conftest import TEST_DATABASES

ROOT = Path(__file__).resolve().parents[2]
#: Streams and sockets stay open (or need an upgrade); their routes are tested in
#: tests/test_gateway*.py with real clients.
STREAMING = ("/ws/", "/api/bot/stream")

schema = schemathesis.openapi.from_dict(openapi())


@pytest.fixture(scope="module")
def gateway_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    url = redis_server.url_for_db(TEST_DATABASES - 1)  # this module's own database
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    up = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "up", "--redis-url", url, "--prefix",
         "agon-openapi", "--port", str(port), "--rate-limit", "100000"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or up.poll() is not None:
                    raise RuntimeError("agon up did not serve its gateway") from None
                time.sleep(0.1)
        yield base
    finally:
        up.terminate()
        up.wait(15)


@schema.exclude(path_regex="|".join(STREAMING)).parametrize()
@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,  # the same cases on every run: CI fails on the code, not on luck
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_route_answers_as_documented(case: schemathesis.Case, gateway_url: str) -> None:
    # Not "schema-valid means accepted": a well-formed move can be illegal, and the engine
    # rightly refuses it (422); the rules are not in the schema.
    case.call_and_validate(base_url=gateway_url, excluded_checks=[positive_data_acceptance])
