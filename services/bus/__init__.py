"""The floor every Agon process stands on: Redis plumbing, and nothing about games.

- `keys`: every key, stream and group name, and the partition hash;
- `connection`: `connect(url)` for a single server or a Redis Cluster, waiting for it;
- `scripts`: Lua scripts by SHA, reloaded in one place;
- `consumer`: the one consumer loop (per-partition reads, heartbeats, claims, drain);
- `cache`: the one bounded cache;
- `clients`: the command client and the query client.

It imports only `schemas` (and `engine` where a type needs it); services and bots build on it.
"""
