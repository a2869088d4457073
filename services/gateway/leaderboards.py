"""A gateway's leaderboards: a read model computed once per version of the results.

The boards of a game are rated from all its result records (Glicko-2, in a thread): far too
much to do per request. They are computed again only when the results change (their
version: one HLEN per partition) or after `BOARD_REFRESH_S`, by one request at a time while
the others are served the boards held (`services.gateway.tournaments` serves them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from services.bus.clients import QueryClient
from services.bus.text import now_ms
from services.tournament.report import ranked

log = logging.getLogger("agon.gateway")

#: A leaderboard is computed again after this long even if no result came (provisional
#: flags are as of when it was computed).
BOARD_REFRESH_S = 300.0


@dataclass(frozen=True)
class Boards:
    """One rules' leaderboards as computed from the results of `version`, at `made`
    (monotonic seconds)."""

    version: tuple[int, ...]
    boards: list[dict[str, Any]]
    made: float


class Leaderboards:
    """A gateway's leaderboards: a read model computed once per version of the results
    (`QueryClient.results_version`: one HLEN per partition), not once per request.

    A request that finds the results changed, while nobody computes them, computes them
    (records read once, parsed and rated in a thread, off the event loop) and waits, so a
    client that reads after a game ended sees it; requests that come while that runs are
    served the previous leaderboards at once rather than queueing behind it or computing
    their own. At most one computation per rules runs at a time, and one set of boards
    per rules is held."""

    def __init__(self) -> None:
        self._held: dict[str, Boards] = {}
        self._making: dict[str, asyncio.Task[Boards]] = {}

    async def boards(self, query: QueryClient, game: str) -> Boards:
        version = await query.results_version(game)
        held = self._held.get(game)
        if (
            held is not None
            and held.version == version
            and time.monotonic() - held.made < BOARD_REFRESH_S
        ):
            return held
        making = self._making.get(game)
        if making is not None and held is not None:
            return held
        if making is None:
            making = asyncio.create_task(self._make(query, game, version))
            self._making[game] = making
            making.add_done_callback(lambda task: self._made(game, task))
        # Shielded: a client that goes away does not cancel what others wait for.
        return await asyncio.shield(making)

    async def _make(self, query: QueryClient, game: str, version: tuple[int, ...]) -> Boards:
        records = await query.results(game)
        boards = await asyncio.to_thread(ranked, records, now_ms())
        return Boards(version, boards, time.monotonic())

    def _made(self, game: str, task: asyncio.Task[Boards]) -> None:
        self._making.pop(game, None)
        if task.cancelled():
            return
        if (error := task.exception()) is not None:
            # Its waiters got the error; one line here for the requests it had no waiter for.
            log.warning("leaderboards of %s: %s", game, error)
            return
        self._held[game] = task.result()

    async def close(self) -> None:
        for task in list(self._making.values()):
            task.cancel()
        await asyncio.gather(*self._making.values(), return_exceptions=True)
