"""Agon on a real 3-master Redis Cluster: every game through every service, verify, rebuild.

The cluster is started from redis-server processes by the session (tests/support/cluster.py); each
test has a key prefix of its own. `connect` must notice the cluster by itself from the URL.
"""

from __future__ import annotations

from redis.asyncio.cluster import RedisCluster

from services.bus.clients import QueryClient
from services.bus.connection import connect
from services.bus.keys import Keys
from services.cli.pipeline import selfplay
from services.projector import compare_read_models, rebuild, snapshot, verify
from tests.support.cluster import ClusterTarget

SPECS: list[tuple[str, dict[str, str]]] = [
    ("supply-chains", {}),
    ("supplier-sabotage", {}),
    ("teeko", {}),
    ("hexade", {}),
    ("overflow", {"size": "4"}),
]


async def test_every_game_through_every_service_on_a_cluster(cluster_url: ClusterTarget) -> None:
    redis = await connect(cluster_url.url)
    keys = Keys(prefix=cluster_url.prefix)
    try:
        assert isinstance(redis, RedisCluster)
        result = await selfplay(redis, keys, SPECS, 2, ["random", "random"], timeout_s=120)
        assert (result.games, result.finished, result.unfinished) == (10, 10, [])
        assert set(result.outcomes) == {name for name, _ in SPECS}
        # The games really are spread over the three masters' slots.
        ids = await QueryClient(redis, keys).game_ids()
        nodes = {redis.get_node_from_key(keys.log(gid)).name for gid in ids}
        assert len(ids) == 10 and len(nodes) > 1

        report = await verify(redis, keys)
        assert (report.problems, report.games) == ([], 10)
        before = await snapshot(redis, keys)
        assert len([name for name in before if ":view:" in name]) == 10
        stats = await rebuild(redis, keys, workers=2, url=cluster_url.url)
        assert (stats.games, stats.skipped) == (10, [])
        assert compare_read_models(before, await snapshot(redis, keys)) == []
    finally:
        await redis.aclose()


async def test_verify_on_a_cluster_finds_an_edited_view(cluster_url: ClusterTarget) -> None:
    redis = await connect(cluster_url.url)
    keys = Keys(prefix=cluster_url.prefix)
    try:
        await selfplay(redis, keys, [("teeko", {})], 2, ["random", "random"], timeout_s=60)
        (gid, _) = await QueryClient(redis, keys).game_ids()
        await redis.set(keys.view(gid), b'{"edited": true}')
        report = await verify(redis, keys)
        assert len(report.problems) == 1 and keys.view(gid) in report.problems[0]
        await rebuild(redis, keys)
        assert (await verify(redis, keys)).problems == []
    finally:
        await redis.aclose()
