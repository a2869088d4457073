"""The interface every bot implements, and the registry of bots by name.

A bot is anything with a `name` and `choose(state, context) -> str`: it looks at an engine
`State` (its own copy, rebuilt from the log's moves) and returns a move in Agon notation.
The worker (`bots.worker`) owns everything around that: inboxes, deadlines, stale turns and
submitting the move; a bot only thinks. Built-in bots register here by name; `load_bot`
resolves a name, and unknown names raise `ValueError` listing the known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine import State


@dataclass(frozen=True, slots=True)
class TurnContext:
    """What a bot may know besides the position: whose turn, which game, how long it has."""

    game_id: str
    seat: int
    seq: int
    #: Wall-clock deadline in ms since the epoch (0: none); a bot should answer well before it.
    deadline_ms: int


class Bot(Protocol):
    name: str

    def choose(self, state: State, context: TurnContext) -> str:
        """The move to play in `state` (not terminal, `context.seat` to move), as notation."""
        ...


_REGISTRY: dict[str, Callable[[], Bot]] = {}


def register_bot(name: str, factory: Callable[[], Bot]) -> None:
    _REGISTRY[name] = factory


def bot_names() -> list[str]:
    return sorted(_REGISTRY)


def load_bot(name: str) -> Bot:
    """A fresh instance of the built-in bot called `name`.

    "<bot>.<label>" (e.g. "random.2") is another player that plays as the built-in <bot>:
    how a tournament seats several of one kind.
    """
    base = name if name in _REGISTRY else name.partition(".")[0]
    try:
        factory = _REGISTRY[base]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(
            f"unknown bot {name!r}; known: {known} (or <bot>.<label> for another of one)"
        ) from None
    bot = factory()
    if base != name:
        bot.name = name
    return bot


__all__ = ["Bot", "TurnContext", "bot_names", "load_bot", "register_bot"]
