"""Every Redis key, stream and consumer-group name of Agon, and the partition hash.

Games are spread over `partitions` (default 16) by a stable hash of the game id
(crc32, never Python's salted `hash()`). Every key of partition p carries the hash
tag `{p}`, so one Lua script can touch a game's log, its partition's feed and its
reply memory atomically, on one server or in Redis Cluster. All names start with a
configurable prefix (default "agon") so that tests and several deployments can share
a server without seeing each other. Nothing else in the code base spells a key.

Layout, for prefix "agon" and partition p:

    agon:{p}:commands                   command stream; group `engine`
    agon:{p}:game:<id>:log              a game's events; entry id "<seq>-0"
    agon:{p}:feed                       every event of the partition; groups of readers
    agon:{p}:games                      zset game id -> creation time (ms)
    agon:{p}:replies:<id>               hash command id -> encoded reply (idempotency)
    agon:{p}:dead                       dead-letter stream (entries nobody can answer)
    agon:{p}:clocks                     zset "<id>|<seq>" -> move deadline (ms), dispatcher
    agon:{p}:view:<id>                  projector: a game's view
    agon:{p}:proj:seen                  projector: hash game id -> last projected seq
    agon:{p}:index:...                  projector: game index zsets (status, game, player, time)
    agon:{p}:botresults:<bot>           projector: one bot's results
    agon:{p}:results:<game>             projector: hash game id -> result record, per rules
    agon:{p}:tresults:<tournament>      projector: hash game id -> result record, per tournament
    agon:{p}:archived                   archive: hash game id -> digest of the results it keeps
    agon:tour:{<id>}:log                a tournament's (or match's) events; entry id "<seq>-0"
    agon:tournaments                    zset tournament id -> creation time (ms)
    agon:tournaments:active             zset of the tournaments a director still runs
    agon:bot:{<bot>}:turns              a bot's inbox; group `workers`
    agon:bots / :keys / :names          outside bots: records, key hashes, case-folded names
    agon:readers:dead                   feed and inbox entries set aside by their readers
    agon:replies:<name>                 a reply stream (e.g. one per gateway or CLI process)
    agon:processes                      hash consumer name -> heartbeat (JSON: role, time, stats)
    agon:secret                         the generated server secret, when AGON_SECRET is unset
    agon:quota:{<action>:<principal>}   a principal's token bucket for an action (quotas)

On a Redis Cluster every `{p}` key of a partition lives in one hash slot; keys without a
tag (reply streams, the heartbeat hash, the readers' dead letters) are each used alone.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

from redis.crc import key_slot

DEFAULT_PREFIX = "agon"
DEFAULT_PARTITIONS = 16

#: Consumer groups.
ENGINE_GROUP = "engine"
WORKERS_GROUP = "workers"
PROJECTOR_GROUP = "projector"
DISPATCHER_GROUP = "dispatcher"
#: Groups that read the feeds: an entry is trimmed once all of them have acknowledged it.
FEED_GROUPS = (PROJECTOR_GROUP, DISPATCHER_GROUP)


def partition_of(game_id: str, partitions: int = DEFAULT_PARTITIONS) -> int:
    """The partition of a game: stable across processes, machines and Python versions."""
    return zlib.crc32(game_id.encode()) % partitions


@functools.cache
def _copy_of(key: str) -> str:
    slot = key_slot(key.encode())
    names = [f"{key}:{{c{i}}}" for i in range(64)]
    return min(names, key=lambda n: abs((key_slot(n.encode()) - slot) % 16384 - 8192))


@dataclass(frozen=True, slots=True)
class Keys:
    """The key names of one Agon deployment (a prefix and a partition count)."""

    prefix: str = DEFAULT_PREFIX
    partitions: int = DEFAULT_PARTITIONS

    def partition(self, game_id: str) -> int:
        return partition_of(game_id, self.partitions)

    def all_partitions(self) -> range:
        return range(self.partitions)

    def _p(self, p: int) -> str:
        return f"{self.prefix}:{{{p}}}"

    def slot(self, p: int) -> int:
        """The Redis Cluster hash slot of partition `p`'s keys."""
        return key_slot(self._p(p).encode())

    def _g(self, game_id: str) -> str:
        return self._p(self.partition(game_id))

    # -- the engine's streams ----------------------------------------------------------
    def commands(self, p: int) -> str:
        return f"{self._p(p)}:commands"

    def commands_for(self, game_id: str) -> str:
        """The command stream a command about `game_id` must go to."""
        return self.commands(self.partition(game_id))

    def log(self, game_id: str) -> str:
        return f"{self._g(game_id)}:game:{game_id}:log"

    def log_pattern(self) -> str:
        """SCAN pattern matching every game log (for tools; services use `games`)."""
        return f"{self.prefix}:{{*}}:game:*:log"

    def feed(self, p: int) -> str:
        return f"{self._p(p)}:feed"

    def games(self, p: int) -> str:
        return f"{self._p(p)}:games"

    def replies_memory(self, game_id: str) -> str:
        return f"{self._g(game_id)}:replies:{game_id}"

    def dead_letter(self, p: int) -> str:
        return f"{self._p(p)}:dead"

    def lease(self, p: int, kind: str) -> str:
        """Who of a service kind owns partition p, and under which epoch
        (`services.bus.ownership`); in the partition's hash slot, for its scripts to check."""
        return f"{self._p(p)}:lease:{kind}"

    def secret(self) -> str:
        """The server secret shared through Redis when the operator sets none."""
        return f"{self.prefix}:secret"

    def quota(self, action: str, principal: str) -> str:
        """A principal's token bucket for an action, shared by every gateway (`quotas.take`);
        its own hash slot on a cluster."""
        return f"{self.prefix}:quota:{{{action}:{principal}}}"

    def outages(self, p: int | None = None) -> str:
        """The spells in which Redis refused the platform's writes (`services.bus.outages`):
        no move clock runs in them. With `p`, those of partition `p` alone (its master
        did not answer: a failover), kept beside the partition's games."""
        return f"{self.prefix}:outages" if p is None else f"{self._p(p)}:outages"

    def processes(self) -> str:
        """Every consumer's heartbeat: how dead consumers are noticed, and what `status` shows."""
        return f"{self.prefix}:processes"

    def processes_copy(self) -> str:
        """The heartbeats' second copy on a Redis Cluster, in the hash slot farthest from the
        first's (so on another master wherever the slots are spread evenly): the death of
        one master must not blind everyone to who is alive (`services.bus.presence`)."""
        return _copy_of(self.processes())

    def reader_dead_letter(self) -> str:
        """Entries the projector, dispatcher or a bot worker could not handle on their own."""
        return f"{self.prefix}:readers:dead"

    # -- dispatcher ---------------------------------------------------------------------
    def clocks(self, p: int) -> str:
        return f"{self._p(p)}:clocks"

    def bot_turns(self, bot: str) -> str:
        return f"{self.prefix}:bot:{{{bot}}}:turns"

    # -- outside bots (the gateway) -----------------------------------------------------
    def registered_bots(self) -> str:
        """Outside bots by name: when each registered (its key is never stored)."""
        return f"{self.prefix}:bots"

    def bot_key_hashes(self) -> str:
        """sha256 of each outside bot's key -> its name: how the gateway knows who knocks."""
        return f"{self.prefix}:bots:keys"

    def bot_names(self) -> str:
        """Each outside bot's case-folded name -> its name: names differ in more than case."""
        return f"{self.prefix}:bots:names"

    # -- replies to clients -------------------------------------------------------------
    def reply_stream(self, name: str) -> str:
        return f"{self.prefix}:replies:{name}"

    def is_reply_stream(self, stream: str) -> bool:
        """Whether a command's `reply_to` names a reply stream: the engine writes nowhere else."""
        prefix = self.reply_stream("")
        return stream.startswith(prefix) and len(stream) > len(prefix)

    # -- projector read models (all in the game's partition, for one atomic write) ----
    def view(self, game_id: str) -> str:
        return f"{self._g(game_id)}:view:{game_id}"

    def projector_seen(self, p: int) -> str:
        return f"{self._p(p)}:proj:seen"

    def index_status(self, p: int, status: str) -> str:
        return f"{self._p(p)}:index:status:{status}"

    def index_game(self, p: int, game: str) -> str:
        return f"{self._p(p)}:index:kind:{game}"

    def index_player(self, p: int, name: str) -> str:
        return f"{self._p(p)}:index:player:{name}"

    def index_time(self, p: int) -> str:
        return f"{self._p(p)}:index:time"

    def bot_results(self, p: int, bot: str) -> str:
        return f"{self._p(p)}:botresults:{bot}"

    def results(self, p: int, game: str) -> str:
        return f"{self._p(p)}:results:{game}"

    def tournament_results(self, p: int, tournament_id: str) -> str:
        return f"{self._p(p)}:tresults:{tournament_id}"

    def results_pattern(self) -> str:
        return self.any_partition("results:*")

    def tournament_results_pattern(self) -> str:
        return self.any_partition("tresults:*")

    # -- the archive (`agon archive`) ---------------------------------------------------
    def archived(self, p: int) -> str:
        """Games of partition p whose log went to an archive directory, each with a digest of
        the results records it keeps (`services.projector.models.kept_digest`)."""
        return f"{self._p(p)}:archived"

    # -- tournaments -------------------------------------------------------------------
    def tournament_log(self, tournament_id: str) -> str:
        return f"{self.prefix}:tour:{{{tournament_id}}}:log"

    def tournaments(self) -> str:
        return f"{self.prefix}:tournaments"

    def active_tournaments(self) -> str:
        return f"{self.prefix}:tournaments:active"

    def any_partition(self, rest: str) -> str:
        """A SCAN pattern for `rest` (itself a pattern) in every partition."""
        return f"{self.prefix}:{{*}}:{rest}"

    def view_pattern(self) -> str:
        return self.any_partition("view:*")

    def index_pattern(self) -> str:
        return self.any_partition("index:*")

    def bot_results_pattern(self) -> str:
        return self.any_partition("botresults:*")

    def projector_seen_pattern(self) -> str:
        return self.any_partition("proj:seen")
