"""A game's log exported (JSON Lines, or a readable record), checked offline, and re-keyed for
an import. Pure: no Redis, no clock; the gateway and `agon verify-export` call it.

JSONL: one line per event, in seq order, each the event's stored msgpack map as one JSON
object with its keys in stored order (ASCII, no spaces). The engine writes every event as
`msgpack.packb(map, use_bin_type=True)` of strings, integers, lists, maps and nils, which
JSON represents exactly, so packing a parsed line the same way gives back the stored bytes,
byte for byte, and anyone can check the hash chain (prev_hash of event n is the sha256 of
event n-1's bytes) and replay the game without the arena. `export_jsonl` checks that for
every event. An event that does not come back byte-exact (written by another encoder: a
float, bin data, a longer integer format than needed...) carries its stored bytes too, as
the base64 of a first key `"_raw"`, followed by its fields as far as JSON can show them; a
reader takes the bytes from `_raw` and checks that they unpack to the fields shown. No
event field is called `_raw` (events forbid unknown fields). A hash per line would not do:
it says what the bytes hashed to, but does not let anyone recompute them from the fields.

What the chain cannot prove: the last event has no successor to vouch for its bytes. Its
game facts (result, scores, reason) are checked by the replay; its `time` and `command_id`
are taken on trust. Nor can it prove where a log comes from: the chain is unkeyed, so anyone
may edit an export and chain it again. The gateway therefore signs what it exports: a last
line `{"type":"signature","alg":"ed25519","key":<public key>,"sig":<signature>}` (base64)
over the exact bytes of the event lines before it (after `SIGNED_CONTEXT`), with an Ed25519
key every gateway derives from the deployment's shared secret (`export_signing_key`, HKDF
with a fixed `info`: no new secret is stored) and publishes (`/.well-known/agon-export-key`).
A trailer, not a header: line n stays event n (seq n) as every problem message counts them,
the signer writes it after the bytes it covers, and a truncated file loses its signature
instead of passing as a shorter signed game. `origin_problem` checks it against a key the
reader trusts; the key inside the line only names the signer, it proves nothing by itself.

Text: a record like a PGN: `[Name "value"]` headers (game, options, seats, result,
reason, times in ISO-8601 UTC, id), a blank line, one numbered move per line with the seat
that played it, then the result. It never shows tokens or token hashes.

Import: `log_problems` checks a log as `agon verify` does (`chain_problems` and
`replay_problems` of `services.gamelog.checks`), and `rekeyed` gives its events under a new
game id, re-chained, the `GameCreated` naming the original in `imported_from`: the engine's
mark, set whatever the file says, which every competition read model skips (an import never
counts in ratings, leaderboards, tournaments or bot health). A file's `tournament` is
dropped, so a forged log cannot name itself into a tournament. Everything else is kept:
seqs, times, command ids, seats (with their token hashes: the game is over, so no token is
ever checked against them again), moves and the result. A signature line is accepted and
dropped (`read_jsonl`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from schemas.codec import (
    MAX_IMPORT_BYTES,
    DecodeError,
    decode_event,
    encode,
    event_hash,
    unpack,
)
from schemas.commands import MAX_IMPORT_EVENTS, ImportGame
from schemas.events import (
    NO_RESULT_REASONS,
    GameCreated,
    GameEnded,
    MovePlayed,
    PlayerSeated,
)
from services.bus.clients import LogEntry
from services.gamelog.checks import chain_problems, replay_problems

__all__ = [
    "RAW",
    "SIGNATURE",
    "ExportError",
    "export_jsonl",
    "export_line",
    "export_signing_key",
    "export_text",
    "import_command",
    "json_line",
    "log_problems",
    "origin_problem",
    "public_key",
    "public_key_b64",
    "read_jsonl",
    "rekeyed",
    "signature_line",
    "split_signature",
    "verify_export",
]

#: The key of a JSONL line that carries an event's stored bytes (base64) itself.
RAW = "_raw"


class ExportError(ValueError):
    """A JSONL export that cannot be read; the message names the line."""


# -- JSON Lines ----------------------------------------------------------------------------
def _pack(obj: Any) -> bytes:
    """An event map packed as the engine packs it (`schemas.codec.encode_map`)."""
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def json_line(event: Mapping[str, Any]) -> str:
    """An event map (as `unpack` gives it) as one JSON line, newline included: for streams
    of events that need no bytes back (`export_line` is the faithful form)."""
    return _json(event) + "\n"


def export_line(data: bytes) -> str:
    """One event's stored bytes as its JSONL line (without the newline)."""
    raw = base64.b64encode(data).decode("ascii")
    try:
        obj = unpack(data)
        text = _json(obj)
    except (DecodeError, TypeError, ValueError):
        return _json({RAW: raw})  # not a map JSON can show: the bytes alone
    if RAW in obj:
        return _json({RAW: raw})
    if _pack(json.loads(text)) == data:
        return text
    return _json({RAW: raw, **obj})


def export_jsonl(entries: Sequence[LogEntry], key: Ed25519PrivateKey | None = None) -> str:
    """A log as JSON Lines: one event per line in seq order, each its stored map; signed by
    `key` (a last `signature_line`) when one is given, unless the game was imported: the
    server vouches only for games played on it, never for a file someone brought."""
    ordered = sorted(entries, key=lambda e: e.seq)
    body = "".join(export_line(e.data) + "\n" for e in ordered)
    imported = bool(ordered) and "imported_from" in unpack(ordered[0].data)
    return body if key is None or imported else body + signature_line(body, key)


# -- the server's signature --------------------------------------------------------------
#: The `type` of an export's last line when the server signed it.
SIGNATURE = "signature"
#: What is signed is this, then the event lines' bytes: a signature made for anything else
#: with the same key can never pass for an export's.
SIGNED_CONTEXT = b"agon export v1\n"
#: HKDF's `info` for the export key: the shared secret also makes seat and admin tokens,
#: and this keeps the derived key unrelated to them.
EXPORT_KEY_INFO = b"agon: export signing key (ed25519) v1"


@functools.lru_cache(maxsize=4)
def export_signing_key(secret: bytes) -> Ed25519PrivateKey:
    """The deployment's export signing key: the same from the same secret in every gateway."""
    seed = HKDF(algorithm=SHA256(), length=32, salt=None, info=EXPORT_KEY_INFO).derive(secret)
    return Ed25519PrivateKey.from_private_bytes(seed)


def public_key_b64(key: Ed25519PrivateKey) -> str:
    """The public half of `key`: its 32 raw bytes in base64, as published and in a file."""
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def public_key(text: str) -> Ed25519PublicKey:
    """A published key (`public_key_b64`); ValueError says why `text` is none."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise ValueError(
            f"not an export key: expected the base64 of 32 bytes, got {text.strip()[:60]!r}"
        ) from None


def signature_line(body: str, key: Ed25519PrivateKey) -> str:
    """The line (newline included) that signs the event lines `body` with `key`."""
    sig = key.sign(SIGNED_CONTEXT + body.encode("utf-8"))
    line = {
        "type": SIGNATURE,
        "alg": "ed25519",
        "key": public_key_b64(key),
        "sig": base64.b64encode(sig).decode("ascii"),
    }
    return _json(line) + "\n"


def _signature_of(line: str) -> dict[str, Any] | None:
    """The map of a signature line, None if `line` is not one."""
    if f'"{SIGNATURE}"' not in line:
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and obj.get("type") == SIGNATURE else None


def split_signature(text: str) -> tuple[str, dict[str, Any] | None]:
    """An export's event lines (exactly as signed) and its signature line's map (None: not
    signed). Only the last line can sign; blank lines after it are ignored."""
    stripped = text.rstrip("\r\n")
    start = stripped.rfind("\n") + 1
    signature = _signature_of(stripped[start:])
    if signature is None:
        return text, None
    return text[:start], signature


def origin_problem(text: str, trusted: Ed25519PublicKey) -> str | None:
    """Why export `text` was not signed with the key `trusted` (None: it was, over exactly
    its event lines)."""
    body, signature = split_signature(text)
    if signature is None:
        return "origin: the export is not signed (a server's export ends with a signature line)"
    if signature.get("alg") != "ed25519":
        return f"origin: unknown signature algorithm {str(signature.get('alg'))[:40]!r}"
    try:
        sig = base64.b64decode(str(signature.get("sig", "")), validate=True)
        trusted.verify(sig, SIGNED_CONTEXT + body.encode("utf-8"))
    except (binascii.Error, ValueError, InvalidSignature):
        trusted_b64 = base64.b64encode(trusted.public_bytes(Encoding.Raw, PublicFormat.Raw))
        if signature.get("key") != trusted_b64.decode("ascii"):
            return (
                f"origin: signed by another key ({str(signature.get('key'))[:60]}), "
                "not the server's: the export was forged or comes from elsewhere"
            )
        return "origin: the signature does not match the events: they were changed after export"
    return None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _line_bytes(line: str) -> bytes:
    """The stored bytes a JSONL line stands for; ValueError says why it stands for none."""
    try:
        obj = json.loads(line, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    except ValueError as exc:  # a duplicate key or NaN/Infinity (the hooks above)
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("type") == SIGNATURE:
        raise ValueError("a signature line, which only the last line may be")
    if RAW not in obj:
        try:
            return _pack(obj)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"cannot be packed as msgpack ({exc})") from None
    raw, shown = obj.pop(RAW), obj
    if not isinstance(raw, str):
        raise ValueError(f"{RAW} must be a base64 string")
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{RAW} is not valid base64") from None
    if shown:
        try:
            stored = json.loads(_json(unpack(data)))
        except (DecodeError, TypeError, ValueError):
            stored = None
        if stored != shown:
            raise ValueError(f"the fields shown disagree with the event's {RAW} bytes")
    return data


def _parse(text: str) -> tuple[list[LogEntry], list[str]]:
    """The entries of a JSONL export (entry n from line n) and a problem per bad line; a
    last signature line is no entry (`split_signature`)."""
    lines = split_signature(text)[0].split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    entries: list[LogEntry] = []
    problems: list[str] = []
    for n, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            problems.append(f"line {n}: empty (an export has one event on every line)")
            continue
        try:
            entries.append(LogEntry(n, _line_bytes(line)))
        except ValueError as exc:
            problems.append(f"line {n}: {exc}")
    return entries, problems


def read_jsonl(text: str) -> list[LogEntry]:
    """The stored events of a JSONL export, entry n from line n; `ExportError` names the
    first line that stands for no event. A last signature line is left out."""
    entries, problems = _parse(text)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ExportError(problems[0] + more)
    if not entries:
        raise ExportError("no events: the export is empty")
    return entries


def _game_id(entries: Sequence[LogEntry]) -> str:
    """The game a log says it is of: its first event's `game_id` ("" if unreadable)."""
    try:
        gid = unpack(entries[0].data).get("game_id") if entries else None
    except DecodeError:
        gid = None
    return gid if isinstance(gid, str) else ""


def log_problems(entries: Sequence[LogEntry]) -> list[str]:
    """Everything wrong with a log on its own: the hash chain, seqs and game ids
    (`chain_problems`), and a replay move for move through the rules (`replay_problems`)."""
    if not entries:
        return ["no events: a log starts with game_created"]
    gid = _game_id(entries) or "?"
    return chain_problems(gid, entries) + replay_problems(gid, entries)


def verify_export(text: str) -> tuple[str, int, list[str]]:
    """Check a JSONL export offline: `(game id, events, problems)`, no problems if it holds.

    Every line must stand for an event (a problem names the line); then the events must
    form the hash chain of one game with seqs 1, 2, ... and replay move for move through
    the rules (entry n and seq n are line n). A signature line is not checked here: see
    `origin_problem`.
    """
    entries, problems = _parse(text)
    gid = _game_id(entries)
    if problems:
        return gid, len(entries), problems
    if not entries:
        return gid, 0, ["no events: the export is empty"]
    return gid, len(entries), log_problems(entries)


# -- import -----------------------------------------------------------------------------
def import_command(text: str, game_id: str, command_id: str, reply_to: str = "") -> ImportGame:
    """The `ImportGame` of a JSONL export as game `game_id`; `ExportError` (a ValueError)
    names the first line that stands for no event map, or says the log is too long. The
    engine checks the chain and replays the game when it decides the command."""
    entries = read_jsonl(text)
    if len(entries) > MAX_IMPORT_EVENTS:
        raise ExportError(f"{len(entries)} events; an import takes at most {MAX_IMPORT_EVENTS}")
    events = []
    for entry in entries:
        try:
            events.append(unpack(entry.data))
        except DecodeError as exc:
            raise ExportError(f"line {entry.seq}: {exc.message}") from None
    command = ImportGame(command_id=command_id, reply_to=reply_to, game_id=game_id, events=events)
    size = len(encode(command))
    if size > MAX_IMPORT_BYTES:
        raise ExportError(f"the import is {size} bytes encoded; at most {MAX_IMPORT_BYTES}")
    return command


def rekeyed(entries: Sequence[LogEntry], game_id: str) -> list[bytes]:
    """A checked log's events as game `game_id`'s: re-chained, and the `GameCreated` naming
    the original game in `imported_from` and in no tournament; every other fact kept. Check
    with `log_problems` first: an event that does not decode raises `DecodeError`."""
    out: list[bytes] = []
    prev = ""
    for entry in entries:
        event = decode_event(entry.data)
        update: dict[str, Any] = {"game_id": game_id, "prev_hash": prev}
        if isinstance(event, GameCreated):
            # The mark is the engine's, whatever the file holds (a file's own
            # `imported_from` is replaced); and a file cannot place a game in a tournament:
            # only the director creates those, and its results are the tournament's.
            update["imported_from"] = event.game_id
            update["tournament"] = None
        data = encode(event.model_copy(update=update))
        out.append(data)
        prev = event_hash(data)
    return out


# -- the readable record -----------------------------------------------------------------
def _iso(ms: int) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _header(name: str, value: object) -> str:
    text = " ".join(str(value).split())  # one line, whatever a name holds
    return f'[{name} "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"]'


def _result(ended: GameEnded | None) -> str:
    if ended is None or ended.reason in NO_RESULT_REASONS:
        return "*"
    return {1: "1-0", 2: "0-1"}.get(ended.result, "1/2-1/2")


def export_text(entries: Sequence[LogEntry]) -> str:
    """A readable record of a game, like a PGN: headers, a blank line, the moves (one per
    line: number, seat, move), the result. Shows no token and no token hash."""
    created: GameCreated | None = None
    seated: dict[int, PlayerSeated] = {}
    moves: list[MovePlayed] = []
    ended: GameEnded | None = None
    unreadable: list[int] = []
    for entry in sorted(entries, key=lambda e: e.seq):
        try:
            event = decode_event(entry.data)
        except DecodeError:
            unreadable.append(entry.seq)
            continue
        if isinstance(event, GameCreated) and created is None:
            created = event
        elif isinstance(event, PlayerSeated):
            seated[event.seat] = event
        elif isinstance(event, MovePlayed):
            moves.append(event)
        elif isinstance(event, GameEnded):
            ended = event
    if created is None:
        raise ValueError("no game_created: this is not a game's log")
    headers = [
        _header("Game", created.game),
        _header("Options", " ".join(f"{k}={v}" for k, v in sorted(created.options.items()))),
    ]
    for seat, spec in enumerate(created.seats, start=1):
        taken = seated.get(seat)
        name, kind = (taken.name, taken.kind) if taken is not None else (spec.name, spec.kind)
        headers.append(_header(f"Seat{seat}", f"{name or '?'} ({kind})"))
    result = _result(ended)
    headers.append(_header("Result", result))
    if ended is not None:
        reason = f"{ended.reason}: {ended.detail}" if ended.detail else ended.reason
        headers.append(_header("Reason", reason))
        if ended.scores is not None:
            headers.append(_header("Scores", "-".join(str(s) for s in ended.scores)))
    headers.append(_header("Created", _iso(created.time)))
    if ended is not None:
        headers.append(_header("Ended", _iso(ended.time)))
    headers.append(_header("Id", created.game_id))
    if created.imported_from is not None:
        headers.append(_header("ImportedFrom", created.imported_from))
    if created.move_time_ms:
        headers.append(_header("MoveTimeMs", created.move_time_ms))
    headers.append(_header("Engine", created.engine_version))
    body = [f"{m.ply + 1}. seat {m.seat}: {m.move}" for m in moves]
    body += [f"{{seq {seq}: an unreadable event}}" for seq in unreadable]
    return "\n".join([*headers, "", *body, result]) + "\n"
