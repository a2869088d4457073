"""The session's Redis Cluster is up, spreads keys over its masters, refuses cross-slot reads."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ClusterCrossSlotError, RedisClusterException

from tests.support.cluster import ClusterTarget, RedisClusterProcesses


async def test_cluster_stores_keys_on_every_master(
    cluster_url: ClusterTarget, redis_cluster: RedisClusterProcesses
) -> None:
    async with RedisCluster.from_url(cluster_url.url, decode_responses=True) as client:
        assert len(client.get_primaries()) == 3
        keys = [f"{cluster_url.prefix}:{{{tag}}}:value" for tag in range(16)]
        for index, key in enumerate(keys):
            assert await client.set(key, str(index))
        assert [await client.get(key) for key in keys] == [str(i) for i in range(16)]
        owners = {getattr(client.get_node_from_key(key), "port", None) for key in keys}
        assert owners == set(redis_cluster.ports)  # tags {0}..{15} land on all three masters
        assert await client.delete(*keys) == 16  # the client splits a multi-key DEL by slot


async def test_xreadgroup_across_hash_tags_is_refused(cluster_url: ClusterTarget) -> None:
    prefix = cluster_url.prefix
    same_a, same_b = f"{prefix}:{{p1}}:a", f"{prefix}:{{p1}}:b"
    other = f"{prefix}:{{p2}}:a"
    async with RedisCluster.from_url(cluster_url.url, decode_responses=True) as client:
        assert client.keyslot(same_a) == client.keyslot(same_b) != client.keyslot(other)
        for stream in (same_a, same_b, other):
            await client.xgroup_create(stream, "g", id="0", mkstream=True)
            await client.xadd(stream, {"n": stream})

        # Two streams with the same hash tag: one XREADGROUP reads both.
        got: Any = await client.xreadgroup("g", "c", {same_a: ">", same_b: ">"}, count=10)
        assert sorted(name for name, _ in got) == [same_a, same_b]

        # Different tags: redis-py refuses before sending (it maps the keys to slots itself).
        with pytest.raises(RedisClusterException, match="all keys must map to the same key slot"):
            await client.xreadgroup("g", "c", {same_a: ">", other: ">"})

        # Sent anyway (to the node of the first key), the server answers CROSSSLOT.
        node = client.get_node_from_key(same_a)
        with pytest.raises(ClusterCrossSlotError, match="hash to the same slot"):
            await client.execute_command(
                "XREADGROUP", "GROUP", "g", "c", "STREAMS", same_a, other, ">", ">",
                target_nodes=node,
            )  # fmt: skip
