"""Issue 22, item 8: no Redis user `agon acl` writes can wipe the data or watch the others.

On a real redis-server started with the users `agon acl` wrote (the `deployment` fixture of
`tests/bus/test_acl.py`), every user, the operator included, tries the server-wide commands that
empty, stop or spy on Redis: REPLICAOF to an empty server drops every key, MONITOR and
SLOWLOG show other users' commands (seat tokens), SCRIPT/FUNCTION writes drop what the
services rely on, DEBUG, SHUTDOWN, FLUSHALL, CONFIG SET, ACL SETUSER... Each must be refused
with NOPERM (and `ACL DRYRUN` must say no too). Every attempt uses arguments that would do
no harm had Redis let it run (`REPLICAOF NO ONE`, `SHUTDOWN ABORT`, `DEBUG SLEEP 0`), since
Redis checks the ACL before it looks at them; so a broken rule shows as a failed test, not
a dead server. Then the
operator's own jobs run as the operator (selfplay, verify, rebuild, status, archive, restore)
and Redis refuses it nothing (its ACL LOG stays empty).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, ResponseError

from services.cli import main as agon
from services.cli.acl import USERS
from tests.bus.test_acl import PREFIX, Deployment, deployment  # noqa: F401 (the fixture)
from tests.security.attacks import report

pytestmark = pytest.mark.timeout(180)

#: The commands no user may run, each with arguments that would be harmless if it ran.
FORBIDDEN: list[tuple[str, ...]] = [
    ("REPLICAOF", "NO", "ONE"),
    ("SLAVEOF", "NO", "ONE"),
    ("MONITOR",),
    ("SLOWLOG", "GET", "1"),
    ("SCRIPT", "FLUSH"),
    ("FUNCTION", "FLUSH"),
    ("FUNCTION", "DELETE", "no-such-library"),
    ("FUNCTION", "LOAD", "#!lua name=probe\nredis.register_function('probe', function() end)"),
    ("FUNCTION", "RESTORE", "not-a-dump"),
    ("DEBUG", "SLEEP", "0"),
    ("SHUTDOWN", "ABORT"),
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("SWAPDB", "9", "9"),
    ("CONFIG", "SET", "lazyfree-lazy-user-del", "no"),
    ("CONFIG", "REWRITE"),
    ("ACL", "SETUSER", "probe-user", "off"),
    ("ACL", "GETUSER", "operator"),
    ("MODULE", "LOAD", "/nonexistent/module.so"),
    ("CLIENT", "KILL", "ID", "0"),
    ("CLIENT", "PAUSE", "1"),
    ("FAILOVER", "ABORT"),
    ("CLUSTER", "RESET"),
    ("SYNC",),
]


async def _refused(url: str, words: tuple[str, ...]) -> bool:
    """Run `words` as the user of `url` on a connection of its own (closed after, so a
    MONITOR that Redis let through ends with it); True when Redis answered NOPERM."""
    client = aioredis.Redis.from_url(url, single_connection_client=True)
    try:
        # A SYNC Redis let through streams the whole dataset and never answers.
        async with asyncio.timeout(2):
            await client.execute_command(*words)
    except TimeoutError:
        return False
    except NoPermissionError:
        return True
    except ResponseError as exc:
        # DEBUG and MODULE are off in redis.conf's defaults too: Redis refuses them before
        # it asks the ACL (which the test asks with DRYRUN).
        return "not allowed" in str(exc)
    finally:
        await client.aclose()
    return False


async def test_no_user_can_wipe_stop_or_watch_redis(deployment: Deployment) -> None:  # noqa: F811
    admin = aioredis.Redis.from_url(deployment.admin_url)
    try:
        await admin.set(f"{PREFIX}:probe", "kept")
        allowed = [
            f"{user}: {' '.join(words[:2])}"
            for user in USERS
            for words in FORBIDDEN
            if not await _refused(deployment.urls[user], words)
            or await admin.execute_command("ACL", "DRYRUN", user, *words) == b"OK"
        ]
        kept = await admin.get(f"{PREFIX}:probe") == b"kept"
        alive = await admin.ping()
    finally:
        await admin.aclose()
    tried = len(USERS) * len(FORBIDDEN)
    held = not allowed and kept and bool(alive)
    report(
        "operator wipes or watches Redis (ACL)",
        held,
        f"{tried - len(allowed)}/{tried} server-wide commands refused NOPERM across "
        f"{len(USERS)} users" + (f"; allowed: {', '.join(allowed)}" if allowed else ""),
    )
    assert held, allowed


async def test_the_operators_own_jobs_run_as_the_operator(
    deployment: Deployment,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGON_SECRET", deployment.secret)
    url = deployment.urls["operator"]
    common = ["--redis-url", url, "--prefix", PREFIX]
    admin = aioredis.Redis.from_url(deployment.admin_url)
    try:
        await admin.acl_log_reset()
        jobs = [
            ["selfplay", "--game", "teeko", "--games", "3", "--bots", "random,greedy", "--verify"],
            ["rebuild"],
            ["verify"],
            ["status", "--json"],
            ["archive", "--older-than", "1s", "--to", str(tmp_path / "archive")],
            ["restore", "--from", str(tmp_path / "archive"), "--all"],
            ["verify"],
        ]
        for job in jobs:
            if job[0] == "archive":
                await asyncio.sleep(1.1)  # the games ended more than 1 s ago
            status = await asyncio.to_thread(agon, [*job, *common])
            printed = capsys.readouterr()
            assert status == 0, (job, printed)
            if job[0] == "archive":
                assert "3 games archived" in printed.out or "archived: 3" in printed.out, printed
        # Redis refused the operator nothing on the way.
        assert await admin.acl_log() == []
    finally:
        await admin.aclose()
