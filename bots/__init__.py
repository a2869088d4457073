"""Agon's bots: the interface every bot implements, the registry, and the built-in bots.

A bot is anything with a `name` and `choose(state, context) -> str`: it looks at an engine
`State` (its own copy, rebuilt from the log's moves) and returns a move in Agon notation.
The worker (`bots.worker`) owns everything around that: inboxes, deadlines, stale turns and
submitting the move; a bot only thinks. Built-in bots register by name when this package
is imported; `load_bot` resolves a name, and unknown names raise `ValueError` listing the
known ones.
"""

from bots import alphabeta, greedy, mcts, random_bot
from bots.base import Bot, TurnContext, bot_names, load_bot, register_bot

__all__ = [
    "Bot",
    "TurnContext",
    "alphabeta",
    "bot_names",
    "greedy",
    "load_bot",
    "mcts",
    "random_bot",
    "register_bot",
]
