"""The game log as every service reads it: folded, checked and exported. Pure: no Redis, no clock.

`fold` is the one fold of a game's events (the engine, the dispatcher, the gateway, the
archive and the projector all fold with it); `checks` checks one log on its own, as a hash
chain and replayed through the rules; `export` writes a log as JSON Lines or a readable
record, checks an export offline and re-keys it for an import. The projector builds its read
models on top of this package, never the other way round, so a service that only needs a
game's log imports no projector. This `__init__` imports nothing: reading a fold does not
load the export's cryptography.
"""
