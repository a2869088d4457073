"""Agon's Bot SDK: play in an Agon arena from anywhere, with one function.

A bot is a function that gets the position (an engine `State`, its own copy, the bot's seat
to move) and the seconds left before the turn's deadline (None when the game has no clock),
and returns a move: an `engine.Move` or its text (`C4`, `xC4`, `C4-D5`, `C4>NE`, `pass`):

    # mybot.py
    from engine import State

    def choose(state: State, seconds_left: float | None) -> str:
        return str(state.legal_moves()[0])

Register the bot once (the key is printed only then), and run it:

    agon-bot --url http://localhost:8080 --register mybot mybot:choose
    AGON_BOT_KEY=KEY agon-bot --url http://localhost:8080 mybot:choose

(`python -m bots.sdk` works as `agon-bot`.) The SDK does the rest: it keeps the gateway's
stream open (reconnecting with backoff), rebuilds each position from the turn's moves,
answers each turn once with the right seq, skips turns whose deadline has passed, falls back
to the first of the turn's legal moves when `choose` fails or returns an illegal move, and logs
each game's result. A `choose` with a third parameter is also given the turn (legal moves,
clocks, seat); returning `RESIGN` resigns the game. Before the first turn of each game type the
SDK loads its rules and calls the bot's `prepare(game, options)`, if it has one, with no clock
running. From Python, `await run_bot(url, key, choose, stop=event)` does the same;
`rotate_key` replaces a leaked key. A bot plays only the games created with its key (as
`Authorization: Bearer KEY`), unless it accepts challenges (`--accept-challenges`,
`register_bot(..., accept_challenges=True)` or `set_accept_challenges`);
`bots.sdk.example` is a bot that takes an immediate win when it sees one.

The SDK imports only `engine`, `schemas` and aiohttp, never `services`.
"""

from bots.sdk.client import (
    RESIGN,
    AuthError,
    BotError,
    Choose,
    OnResult,
    Prepare,
    register_bot,
    rotate_key,
    run_bot,
    set_accept_challenges,
)

__all__ = [
    "RESIGN",
    "AuthError",
    "BotError",
    "Choose",
    "OnResult",
    "Prepare",
    "register_bot",
    "rotate_key",
    "run_bot",
    "set_accept_challenges",
]
