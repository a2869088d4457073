"""Seat tokens: how a command proves it speaks for a seat, without tokens in any log.

A log keeps only `token_hash(token)`, and so does every other store: tokens are derived,
never drawn and kept. A person gets `human_token(secret, game_id, seat, command_id)` in the
reply to `SeatPlayer` (the engine's reply memory keeps that reply without it, and a retry
derives it again). Bot seats are seated at creation: `bot_token(secret, game_id, seat)` =
HMAC-SHA256 of "game_id|seat" under the server secret: env `AGON_SECRET`, else one that
the first service of a deployment generates and shares through Redis
(`services.bus.secret`); there is no default anyone could read.
The dispatcher puts the token in each turn request; a worker with the secret could derive
it too. The operator's `admin_token(secret)` may abort any game.

A bot's move clock runs from when the dispatcher handed the turn over, not from the event
that made it the bot's turn, so the platform's own lag is never the bot's. The dispatcher
signs that deadline (`clock_stamp`); the bot sends the stamp back with its move (and the
dispatcher with its timeout claim), and the engine takes the later of the stamped deadline
and its own (`stamped_deadline`). Only a holder of the secret can make a stamp.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets


def secret_from_env() -> bytes | None:
    """The operator's secret (env `AGON_SECRET`), if one is set."""
    value = os.environ.get("AGON_SECRET", "")
    return value.encode() if value else None


def new_secret() -> bytes:
    """A fresh random server secret (256 bits)."""
    return secrets.token_hex(32).encode()


def _raw(token: str) -> bytes:
    # Any text a client sent, even one with lone surrogates, hashes and compares as bytes.
    return token.encode("utf-8", "surrogatepass")


def token_hash(token: str) -> str:
    return hashlib.sha256(_raw(token)).hexdigest()


def tokens_equal(given: str, expected: str) -> bool:
    """Constant-time comparison of two tokens, for any text a client may send."""
    return hmac.compare_digest(_raw(given), _raw(expected))


def bot_token(secret: bytes, game_id: str, seat: int) -> str:
    return hmac.new(secret, f"{game_id}|{seat}".encode(), hashlib.sha256).hexdigest()


def admin_token(secret: bytes) -> str:
    return hmac.new(secret, b"admin", hashlib.sha256).hexdigest()


def _clock_mac(secret: bytes, game_id: str, seq: int, deadline: int) -> str:
    message = f"clock|{game_id}|{seq}|{deadline}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()[:32]


def clock_stamp(secret: bytes, game_id: str, seq: int, deadline: int) -> str:
    """The signed deadline of the turn at `seq` of `game_id`: "<deadline ms>.<mac>"."""
    return f"{deadline}.{_clock_mac(secret, game_id, seq, deadline)}"


def stamped_deadline(secret: bytes, game_id: str, seq: int, stamp: str) -> int | None:
    """The deadline a stamp signs for this game and seq, or None if it signs none."""
    deadline, _, mac = stamp.partition(".")
    if not (deadline.isascii() and deadline.isdigit() and len(deadline) <= 16):
        return None
    expected = _clock_mac(secret, game_id, seq, int(deadline))
    return int(deadline) if tokens_equal(mac, expected) else None


def human_token(secret: bytes, game_id: str, seat: int, command_id: str) -> str:
    """The token of a person seated in `seat` by the command `command_id`.

    Derived, not drawn, so that nothing but its hash is ever stored: a seat command retried
    after its reply was lost gets the same token again from the same derivation."""
    message = f"human|{game_id}|{seat}|{command_id}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def token_matches(token: str, expected_hash: str) -> bool:
    """Constant-time check of a token against the hash a log recorded."""
    return hmac.compare_digest(token_hash(token), expected_hash)
