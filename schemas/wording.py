"""How a game's end is worded for people: one table the command line and the web page share.

A `GameEnded` says why the game ended in two words: its `reason` (a closed set, `EndReason`)
and, for a natural end, the engine's rule (`detail`, an `EndRule`). `REASONS` and `RULES`
word them; `ending` picks the words for a result. The page reads the same tables as a module
the gateway writes from them (`/web/words.js`, `words_module`), so `agon replay` and the
board say "Blue wins — no placement left" alike.
"""

from __future__ import annotations

import json

from schemas.events import NO_RESULT_REASONS

#: How a game ended, per `GameEnded.reason` (a natural end needs no words: its rule says it).
REASONS: dict[str, str] = {
    "natural": "",
    "resignation": "by resignation",
    "time_forfeit": "on time",
    "illegal_move": "illegal move",
    "no_reply": "no reply",
    "disconnect": "disconnect",
    "abort": "aborted",
    "aborted": "aborted by the platform",
    "interrupted": "interrupted",
}

#: For a natural end, the engine's rule (`engine.core.EndRule`).
RULES: dict[str, str] = {
    "no-moves": "no placement left",
    "all-passed": "both passed",
    "house-emptied": "a house emptied",
    "line": "a line",
    "square": "a square",
    "ring": "a ring of six",
    "triangle": "a triangle",
    "move-limit": "move limit",
}


def ending(reason: str, detail: str = "") -> str:
    """Why a game ended, in words: "a square", "on time"; a detail no table words as it is."""
    if reason == "natural":
        return RULES.get(detail, detail)
    return REASONS.get(reason, reason)


def words_module() -> str:
    """The tables as an ES module for the page (`/web/words.js`)."""
    tables = {"REASONS": REASONS, "RULES": RULES, "NO_RESULT": sorted(NO_RESULT_REASONS)}
    lines = [f"export const {name} = {json.dumps(table)};" for name, table in tables.items()]
    head = "// Written by the gateway from schemas/wording.py: how a game's end is worded."
    return "\n".join([head, *lines, ""])
