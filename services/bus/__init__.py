"""The floor every Agon process stands on: Redis plumbing, and nothing about games.

- `keys`: every key, stream and group name, and the partition hash;
- `connection`: `connect(url)` for a single server or a Redis Cluster, waiting for it;
- `scripts`: Lua scripts by SHA, reloaded in one place;
- `reader`: the group reader (per-partition reads, claims); `consumer`: the one loop around it;
- `cache`: the one bounded cache;
- `clients`: the command client and the query client;
- `text`: `as_text`, `now_ms`, `id_ms`, for the many modules that need no consumer loop;
- `delivery`: a bot's turn reaching it, which starts its clock; `admission`: how many
  clocked games the measured lag allows; `secret`, `outages`, `stuck`, `quotas`, `registry`.

It imports only `schemas` (and `engine` where a type needs it); services and bots build on it.
"""
