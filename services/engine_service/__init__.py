"""The engine service: the only writer of game logs.

`decide` is the functional core (rules, seats, tokens, clocks; no I/O), `store` the
atomic append to the logs, `service` the consumer that reads commands and commits their
outcomes.
"""

from services.engine_service.decide import GameRecord, Reject, Rules
from services.engine_service.service import MAX_DELIVERIES, EngineService, settle_heap
from services.engine_service.store import Commit, Committed, EventStore, SeqConflict

__all__ = [
    "MAX_DELIVERIES",
    "Commit",
    "Committed",
    "EngineService",
    "EventStore",
    "GameRecord",
    "Reject",
    "Rules",
    "SeqConflict",
    "settle_heap",
]
