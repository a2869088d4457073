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

A bot's move clock runs from when its turn reached it, not from the event that made it
the bot's turn, so the platform's own lag is never the bot's. Whoever hands the bot its turn
(a built-in bot's worker, or the gateway writing to an outside bot's stream) signs the
deadline it gives (`clock_stamp`) with the clock key (`clock_key`, derived from the secret,
so a worker can sign clocks without holding the secret); the bot sends the stamp back with
its move (and the dispatcher with its timeout claim), and the engine takes the later of the
stamped deadline and its own (`stamped_deadline`), never more than `MAX_GRACE_MS` past its
own. A claim that a bot's turn never reached it in time is signed with the secret itself
(`late_stamp`): the game then ends with the platform's termination, not the bot's.
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


#: The most a signed clock may extend a turn past its deadline counted from the event that
#: made it the seat's turn: the platform's lag is forgiven up to this, so a stuck platform
#: cannot give a bot unlimited time; a turn that reached its bot later ends the game with
#: the platform's termination.
MAX_GRACE_MS = 15_000
#: What the platform forgives of its own lag between a bot's answer and the command stream
#: (a busy event loop, the network): a clock is signed this much past the deadline the bot
#: is told, the same for every bot, as lichess compensates lag.
SEND_GRACE_MS = 250


def clock_key(secret: bytes) -> bytes:
    """The key that signs move clocks, derived from the secret: a process that hands bots
    their turns (a bot worker) holds this one, which can sign clocks and nothing else."""
    return hmac.new(secret, b"clock", hashlib.sha256).hexdigest().encode()


def _clock_mac(key: bytes, kind: str, game_id: str, seq: int, deadline: int) -> str:
    message = f"{kind}|{game_id}|{seq}|{deadline}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:32]


def clock_stamp(key: bytes, game_id: str, seq: int, deadline: int) -> str:
    """The deadline of the turn at `seq` of `game_id`, signed with the clock key:
    "<deadline ms>.<mac>"."""
    return f"{deadline}.{_clock_mac(key, 'clock', game_id, seq, deadline)}"


def late_stamp(secret: bytes, game_id: str, seq: int, deadline: int) -> str:
    """The platform's word, signed with the secret, that the turn at `seq` never reached
    its bot by `deadline`: "<deadline ms>.late.<mac>"."""
    return f"{deadline}.late.{_clock_mac(secret, 'late', game_id, seq, deadline)}"


def _signed(key: bytes, kind: str, game_id: str, seq: int, deadline: str, mac: str) -> int | None:
    if not (deadline.isascii() and deadline.isdigit() and len(deadline) <= 16):
        return None
    expected = _clock_mac(key, kind, game_id, seq, int(deadline))
    return int(deadline) if tokens_equal(mac, expected) else None


def stamped_deadline(key: bytes, game_id: str, seq: int, stamp: str) -> int | None:
    """The deadline a clock stamp signs for this game and seq, or None if it signs none."""
    deadline, _, mac = stamp.partition(".")
    return _signed(key, "clock", game_id, seq, deadline, mac)


def late_deadline(secret: bytes, game_id: str, seq: int, stamp: str) -> int | None:
    """The deadline a `late_stamp` signs for this game and seq, or None if it is none."""
    deadline, _, rest = stamp.partition(".")
    mark, _, mac = rest.partition(".")
    return _signed(secret, "late", game_id, seq, deadline, mac) if mark == "late" else None


def human_token(secret: bytes, game_id: str, seat: int, command_id: str) -> str:
    """The token of a person seated in `seat` by the command `command_id`.

    Derived, not drawn, so that nothing but its hash is ever stored: a seat command retried
    after its reply was lost gets the same token again from the same derivation."""
    message = f"human|{game_id}|{seat}|{command_id}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def token_matches(token: str, expected_hash: str) -> bool:
    """Constant-time check of a token against the hash a log recorded."""
    return hmac.compare_digest(token_hash(token), expected_hash)
