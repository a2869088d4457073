"""Game log export (JSONL and text), offline verification, `agon verify-export`, and import.

Logs are made by the engine's functional core (`Rules.decide`, no Redis) for every game,
exported, verified and tampered with; the import goes through the whole pipeline against a
real redis-server (engine, projector, verify, rebuild).
"""

from __future__ import annotations

import base64
import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis

from engine.core import game_names
from schemas.codec import (
    FIELD_BYTES,
    MAX_ENTRY_BYTES,
    MAX_IMPORT_BYTES,
    DecodeError,
    decode_command,
    decode_event,
    decode_reply,
    encode,
    event_hash,
    unpack,
)
from schemas.commands import CreateGame, ImportGame, PlayMove, Resign, SeatPlayer, SeatSpec
from schemas.events import GameCreated, PlayerSeated
from schemas.replies import Accepted, Rejected, Reply
from schemas.tokens import bot_token, human_token
from services.bus.clients import CommandClient, LogEntry, QueryClient
from services.bus.keys import Keys
from services.cli.pipeline import ServiceSet, create_games
from services.engine_service.decide import Reject, Rules
from services.gamelog.checks import chain_problems
from services.gamelog.export import (
    RAW,
    ExportError,
    export_jsonl,
    export_signing_key,
    export_text,
    import_command,
    origin_problem,
    public_key_b64,
    read_jsonl,
    verify_export,
)
from services.projector import compare_read_models, rebuild, snapshot, verify

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"export-secret"
RULES = Rules(SECRET)
BOTS = [SeatSpec(kind="bot", name="random"), SeatSpec(kind="bot", name="random")]
KEYS = Keys()


# -- logs made by the engine's functional core ----------------------------------------------
def play(
    game: str,
    seed: int = 1,
    *,
    options: dict[str, str] | None = None,
    seats: list[SeatSpec] | None = None,
    resign_after: int | None = None,
    stop_after: int | None = None,
) -> list[LogEntry]:
    """A seeded random game decided by `Rules.decide`, as the stored log entries.

    Human seats are taken with `SeatPlayer`; `resign_after` moves, seat 2 resigns;
    `stop_after` moves, the game is left unfinished.
    """
    gid = f"{game}-{seed}"
    now = 1_700_000_000_000
    decision = RULES.decide(
        None,
        CreateGame(
            command_id="create",
            game_id=gid,
            game=game,
            options=options or {},
            seats=seats or BOTS,
            move_time_ms=60_000,
            seed=seed,
        ),
        now,
    )
    rec, data = decision.record, list(decision.events)
    tokens = {s: bot_token(SECRET, gid, s) for s in (1, 2)}
    for seat, spec in enumerate(seats or BOTS, start=1):
        if spec.kind == "human":
            now += 1000
            taken = SeatPlayer(command_id=f"seat{seat}", game_id=gid, seat=seat, name=spec.name)
            data += RULES.decide(rec, taken, now).events
            tokens[seat] = human_token(SECRET, gid, seat, taken.command_id)
    rng = random.Random(seed)
    n = 0
    while rec.end_reason is None:
        if n == stop_after:
            break
        now += rng.randrange(1, 5000)
        if n == resign_after:
            resign = Resign(command_id="resign", game_id=gid, seat=2, token=tokens[2])
            data += RULES.decide(rec, resign, now).events
            continue
        state = rec.state
        seat = state.seat_to_move
        move = str(rng.choice(state.legal_moves()))
        n += 1
        cmd = PlayMove(
            command_id=f"m{n}",
            game_id=gid,
            seat=seat,
            token=tokens[seat],
            move=move,
            expected_seq=rec.head,
        )
        data += RULES.decide(rec, cmd, now).events
    return [LogEntry(seq, d) for seq, d in enumerate(data, start=1)]


def events(entries: list[LogEntry]) -> list[dict[str, Any]]:
    return [unpack(e.data) for e in entries]


def rechain(datas: list[bytes], start: int) -> list[bytes]:
    """Re-link events `start`... to the (changed) bytes before them, as a forger would."""
    out = list(datas)
    for i in range(max(start, 1), len(out)):
        ev = decode_event(out[i]).model_copy(update={"prev_hash": event_hash(out[i - 1])})
        out[i] = encode(ev)
    return out


@pytest.fixture(scope="module")
def teeko() -> list[LogEntry]:
    return play("teeko", seed=7)


# -- JSONL: a faithful export ------------------------------------------------------------------
@pytest.mark.parametrize("game", game_names())
def test_every_games_export_round_trips_and_verifies(game: str) -> None:
    entries = play(game, seed=3)
    assert decode_event(entries[-1].data).type == "game_ended"
    text = export_jsonl(entries)
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) == len(entries) + 1
    for line, ev in zip(lines, events(entries), strict=False):
        parsed = json.loads(line)
        assert parsed == ev and list(parsed) == list(ev)  # the stored map, keys as stored
        assert RAW not in parsed
    # Packing each line again gives the stored bytes: the chain can be checked offline.
    assert read_jsonl(text) == entries
    assert verify_export(text) == (f"{game}-3", len(entries), [])


def test_an_event_that_does_not_pack_back_carries_its_bytes() -> None:
    entries = play("teeko", seed=2)
    datas = [e.data for e in entries]
    # Another encoder wrote event 3's seq in a wider integer format than msgpack needs,
    # and event 4's command id as bin data: JSON cannot say either, so the chain would
    # break unless the export carried those bytes.
    wide = datas[2].replace(b"\xa3seq\x03", b"\xa3seq\xce\x00\x00\x00\x03", 1)
    assert wide != datas[2]
    datas[2] = wide
    datas = rechain(datas, 3)
    binary = datas[3].replace(b"\xaacommand_id\xa6create", b"\xaacommand_id\xc4\x06create", 1)
    assert binary != datas[3]
    datas[3] = binary
    datas = rechain(datas, 4)
    forged = [LogEntry(n, d) for n, d in enumerate(datas, start=1)]
    assert chain_problems("teeko-2", forged) == []
    text = export_jsonl(forged)
    lines = text.splitlines()
    third, fourth = json.loads(lines[2]), json.loads(lines[3])
    assert next(iter(third)) == RAW and base64.b64decode(third[RAW]) == wide
    assert third["seq"] == 3 and third["type"] == "player_seated"  # still readable
    assert fourth == {RAW: base64.b64encode(binary).decode()}
    assert RAW not in json.loads(lines[4])
    assert read_jsonl(text) == forged
    assert verify_export(text) == ("teeko-2", len(forged), [])
    # Without the bytes, the fields alone do not give the stored bytes back.
    del third[RAW]
    lines[2] = json.dumps(third, separators=(",", ":"))
    _, _, problems = verify_export("\n".join(lines))
    assert any(p.startswith("game teeko-2 entry 4: prev_hash") for p in problems), problems
    # And the fields shown must be the bytes' fields.
    third = json.loads(text.splitlines()[2])
    assert third["seat"] == 2
    third["seat"] = 1
    lines[2] = json.dumps(third)
    _, _, problems = verify_export("\n".join(lines))
    assert problems == [f"line 3: the fields shown disagree with the event's {RAW} bytes"]


# -- tampering ---------------------------------------------------------------------------------
def _lines(entries: list[LogEntry]) -> list[str]:
    return export_jsonl(entries).splitlines()


def _first(entries: list[LogEntry], kind: str, after: int = 0) -> int:
    """The 0-based line of the first event of `kind` after line `after`."""
    return next(i for i, e in enumerate(events(entries)) if e["type"] == kind and i >= after)


def test_a_changed_move_is_found(teeko: list[LogEntry]) -> None:
    lines = _lines(teeko)
    i = _first(teeko, "move_played")
    ev = json.loads(lines[i])
    other = json.loads(lines[i + 1])["move"]  # the cell the next move takes
    lines[i] = json.dumps({**ev, "move": other}, separators=(",", ":"))
    gid, count, problems = verify_export("\n".join(lines))
    seq = i + 1
    assert (gid, count) == ("teeko-7", len(teeko))
    assert problems[0].startswith(f"game teeko-7 entry {seq + 1}: prev_hash")
    assert f"sha256 of entry {seq}" in problems[0]
    assert any(
        p.startswith(f"game teeko-7 seq {seq + 1}: move {other!r} rejected") for p in problems
    )


def test_a_dropped_line_is_found(teeko: list[LogEntry]) -> None:
    lines = _lines(teeko)
    i = _first(teeko, "move_played", after=6)
    del lines[i]
    _, count, problems = verify_export("\n".join(lines))
    assert count == len(teeko) - 1
    assert problems[0] == f"game teeko-7 entry {i + 1}: event seq {i + 2}, expected {i + 1}"


def test_the_last_line_dropped_is_found(teeko: list[LogEntry]) -> None:
    # Nothing links to the last event; the replay sees the game has no end.
    _, _, problems = verify_export("\n".join(_lines(teeko)[:-1]))
    assert problems == ["game teeko-7: the rules ended the game but the log has no game_ended"]


def test_reordered_lines_are_found(teeko: list[LogEntry]) -> None:
    lines = _lines(teeko)
    i = _first(teeko, "move_played", after=4)
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    _, _, problems = verify_export("\n".join(lines))
    assert problems[0] == f"game teeko-7 entry {i + 1}: event seq {i + 2}, expected {i + 1}"
    assert f"game teeko-7 entry {i + 2}: event seq {i + 1}, expected {i + 2}" in problems


@pytest.mark.parametrize(("field", "value"), [("time", 5), ("command_id", "forged"), ("seat", 2)])
def test_an_edited_field_is_found(teeko: list[LogEntry], field: str, value: Any) -> None:
    lines = _lines(teeko)
    i = _first(teeko, "player_seated")
    ev = json.loads(lines[i])
    assert ev[field] != value
    lines[i] = json.dumps({**ev, field: value}, separators=(",", ":"))
    _, _, problems = verify_export("\n".join(lines))
    assert problems[0].startswith(f"game teeko-7 entry {i + 2}: prev_hash"), problems


def test_an_edited_result_is_found_by_the_replay(teeko: list[LogEntry]) -> None:
    lines = _lines(teeko)
    end = json.loads(lines[-1])
    forged = 3 - end["result"]
    lines[-1] = json.dumps({**end, "result": forged}, separators=(",", ":"))
    _, _, problems = verify_export("\n".join(lines))
    seq = len(lines)
    want = f"game teeko-7 seq {seq}: result is {forged} in the log, the rules say {end['result']}"
    assert problems == [want]


def test_a_forged_game_rechained_is_still_found_by_the_replay(teeko: list[LogEntry]) -> None:
    # Whoever re-links every hash after an edit gets past the chain, not past the rules.
    datas = [e.data for e in teeko]
    i = _first(teeko, "move_played")
    ev = unpack(datas[i])
    ev["move"] = unpack(datas[i + 1])["move"]
    datas[i] = msgpack.packb(ev, use_bin_type=True)
    forged = [LogEntry(n, d) for n, d in enumerate(rechain(datas, i + 1), start=1)]
    _, _, problems = verify_export(export_jsonl(forged))
    assert problems and all("prev_hash" not in p for p in problems)
    assert problems[0].startswith(f"game teeko-7 seq {i + 2}: move")


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"v":1,', "line 3: not JSON (Expecting property name enclosed in double quotes"),
        ("[1, 2]", "line 3: expected a JSON object, got list"),
        ("", "line 3: empty (an export has one event on every line)"),
        ('{"seq": NaN}', "line 3: not JSON (NaN is not a number JSON allows"),
        ('{"seq": 1, "seq": 2}', "line 3: not JSON (key 'seq' appears twice"),
        ('{"_raw": "!!"}', "line 3: _raw is not valid base64"),
    ],
)
def test_an_unreadable_line_is_named(teeko: list[LogEntry], line: str, problem: str) -> None:
    lines = _lines(teeko)
    lines[2] = line
    gid, _, problems = verify_export("\n".join(lines) + "\n")
    assert gid == "teeko-7"
    assert len(problems) == 1 and problems[0].startswith(problem), problems
    with pytest.raises(ExportError, match=re.escape(problem)):
        read_jsonl("\n".join(lines))


def test_an_empty_export_and_windows_line_ends() -> None:
    assert verify_export("") == ("", 0, ["no events: the export is empty"])
    with pytest.raises(ExportError, match="empty"):
        read_jsonl("\n")
    entries = play("overflow", seed=1, options={"size": "3"})
    text = export_jsonl(entries).replace("\n", "\r\n")
    assert verify_export(text) == ("overflow-1", len(entries), [])


# -- the readable record -----------------------------------------------------------------------
def test_text_export_has_headers_numbered_moves_and_no_token_hash() -> None:
    seats = [SeatSpec(kind="human", name='ann "the" bold'), SeatSpec(kind="bot", name="random")]
    entries = play("teeko", seed=4, seats=seats, resign_after=6)
    text = export_text(entries)
    head, _, body = text.partition("\n\n")
    assert head.splitlines() == [
        '[Game "teeko"]',
        '[Options "markers=8"]',
        '[Seat1 "ann \\"the\\" bold (human)"]',
        '[Seat2 "random (bot)"]',
        '[Result "1-0"]',
        '[Reason "resignation: seat 2 resigned"]',
        '[Created "2023-11-14T22:13:20.000Z"]',
        f'[Ended "{_iso_of_last(entries)}"]',
        '[Id "teeko-4"]',
        '[MoveTimeMs "60000"]',
        '[Engine "1"]',
    ]
    moves = [e for e in events(entries) if e["type"] == "move_played"]
    assert len(moves) == 6
    want = [f"{m['ply'] + 1}. seat {m['seat']}: {m['move']}" for m in moves]
    assert body.splitlines() == [*want, "1-0"]
    assert body.splitlines()[0].startswith("1. seat 1: ")
    hashes = [e["token_hash"] for e in events(entries) if e["type"] == "player_seated"]
    assert len(hashes) == 2
    for h in hashes:
        assert h not in text
    assert not re.search(r"[0-9a-f]{64}", text)


def _iso_of_last(entries: list[LogEntry]) -> str:
    from datetime import UTC, datetime

    ms = unpack(entries[-1].data)["time"]
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{ms % 1000:03d}Z"
    )


@pytest.mark.parametrize("game", game_names())
def test_text_results_follow_the_log(game: str) -> None:
    entries = play(game, seed=5)
    end = unpack(entries[-1].data)
    want = {1: "1-0", 2: "0-1", 0: "1/2-1/2"}[end["result"]]
    text = export_text(entries)
    assert f'[Result "{want}"]' in text and text.endswith(f"\n{want}\n")
    assert f'[Reason "natural: {end["detail"]}"]' in text
    unfinished = export_text(play(game, seed=5, stop_after=3))
    assert '[Result "*"]' in unfinished and "[Ended " not in unfinished
    numbered = [line for line in unfinished.splitlines() if re.match(r"\d+\. seat [12]: ", line)]
    assert [line.partition(".")[0] for line in numbered] == ["1", "2", "3"]
    assert unfinished.endswith(f"\n{numbered[-1]}\n*\n")


# -- the server's signature ----------------------------------------------------------------------
def test_a_signed_export_reads_as_its_events_and_proves_its_origin(teeko: list[LogEntry]) -> None:
    key = export_signing_key(b"the deployment's secret")
    assert public_key_b64(export_signing_key(b"the deployment's secret")) == public_key_b64(key)
    text = export_jsonl(teeko, key)
    lines = text.splitlines(keepends=True)
    assert len(lines) == len(teeko) + 1 and "".join(lines[:-1]) == export_jsonl(teeko)
    signature = json.loads(lines[-1])
    assert signature["type"] == "signature" and signature["key"] == public_key_b64(key)
    # The signature line is no event: reading, verifying and importing leave it out.
    assert read_jsonl(text) == teeko
    assert verify_export(text) == ("teeko-7", len(teeko), [])
    assert len(import_command(text, "n", "c").events) == len(teeko)
    assert origin_problem(text, key.public_key()) is None
    other = export_signing_key(b"another deployment").public_key()
    assert str(origin_problem(text, other)).startswith("origin: signed by another key")
    assert str(origin_problem(export_jsonl(teeko), key.public_key())).startswith(
        "origin: the export is not signed"
    )
    # One byte of the events changed under the server's signature (the same event to JSON).
    edited = text.replace('"ply":0,', '"ply": 0,', 1)
    assert edited != text
    assert str(origin_problem(edited, key.public_key())).startswith(
        "origin: the signature does not match"
    )
    # Only the last line may sign: one in the middle is a bad event line.
    moved = "".join([lines[-1], *lines[:-1]])
    assert verify_export(moved)[2][0] == "line 1: a signature line, which only the last line may be"


def test_cli_checks_origin_with_a_key(teeko: list[LogEntry], tmp_path: Path) -> None:
    key = export_signing_key(b"the deployment's secret")
    signed = tmp_path / "signed.jsonl"
    signed.write_text(export_jsonl(teeko, key))
    out = agon(str(signed), "--key", public_key_b64(key))
    assert (out.returncode, out.stderr) == (0, "")
    assert (
        out.stdout
        == f"ok: game teeko-7, {len(teeko)} events, hash chain, replay and origin verified\n"
    )
    unkeyed = agon(str(signed))
    assert unkeyed.returncode == 0 and "origin not checked" in unkeyed.stdout
    other = public_key_b64(export_signing_key(b"another deployment"))
    out = agon(str(signed), "--key", other)
    assert out.returncode == 1 and len(out.stdout.splitlines()) == 1
    assert out.stdout.startswith("origin: signed by another key")
    for bad in (
        ["--key", "not base64!"],
        ["--gateway", "ftp://x"],
        ["--gateway", "http://127.0.0.1:1"],
    ):
        out = agon(str(signed), *bad)
        assert out.returncode == 2 and out.stdout == "", (bad, out)
        assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr


# -- agon verify-export --------------------------------------------------------------------------
def agon(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "verify-export", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_ok_problems_and_unreadable_files(teeko: list[LogEntry], tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(export_jsonl(teeko))
    out = agon(str(good))
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout == f"ok: game teeko-7, {len(teeko)} events, hash chain and replay verified\n"
    assert agon("-", stdin=good.read_text()).stdout == out.stdout

    lines = _lines(teeko)
    lines[5], lines[6] = lines[6], lines[5]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    out = agon(str(bad))
    assert out.returncode == 1 and out.stderr == ""
    printed = out.stdout.splitlines()
    assert printed[0] == "game teeko-7 entry 6: event seq 7, expected 6"
    assert printed == verify_export(bad.read_text())[2]

    broken = tmp_path / "broken.jsonl"
    broken.write_text("not json\n")
    out = agon(str(broken))
    assert (out.returncode, out.stdout) == (1, "line 1: not JSON (Expecting value at column 1)\n")

    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    for path, reason in [
        (tmp_path / "missing.jsonl", "No such file or directory"),
        (tmp_path, "Is a directory"),
        (binary, "not UTF-8 text"),
    ]:
        out = agon(str(path))
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.startswith(f"agon verify-export: cannot read {path}: {reason}")
        assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr


# -- import: the engine's decision (no Redis) --------------------------------------------------
def _import(entries: list[LogEntry], game_id: str = "imported") -> ImportGame:
    return import_command(export_jsonl(entries), game_id, f"import-{game_id}")


@pytest.mark.parametrize("game", game_names())
def test_the_engine_imports_every_finished_game(game: str) -> None:
    entries = play(game, seed=8)
    decision = RULES.decide(None, _import(entries), now=1)
    new = [LogEntry(n, d) for n, d in enumerate(decision.events, start=1)]
    assert decision.record.fold.status == "ended" and decision.record.head == len(entries)
    before, after = events(entries), events(new)
    assert after[0]["imported_from"] == f"{game}-8"
    for old, ev in zip(before, after, strict=True):
        assert ev["game_id"] == "imported"
        changed = {k for k in ev if ev[k] != old.get(k)} | (old.keys() - ev.keys())
        # Re-keyed and re-chained (the first event links to nothing either way); the rest kept.
        want = {"game_id", "imported_from"} if ev["seq"] == 1 else {"game_id", "prev_hash"}
        assert changed == want
    assert verify_export(export_jsonl(new)) == ("imported", len(entries), [])
    assert "[ImportedFrom " in export_text(new)


def test_the_engine_marks_an_import_and_drops_its_tournament_whatever_the_file_says(
    teeko: list[LogEntry],
) -> None:
    # A forger's file: the GameCreated already says "imported from elsewhere" and names a
    # tournament; re-chained, so the log itself holds.
    first = decode_event(teeko[0].data).model_copy(
        update={"imported_from": "elsewhere", "tournament": "t0123456789"}
    )
    datas = rechain([encode(first), *(e.data for e in teeko[1:])], 1)
    forged = [LogEntry(n, d) for n, d in enumerate(datas, start=1)]
    decision = RULES.decide(None, _import(forged), now=1)
    created = decode_event(decision.events[0])
    assert isinstance(created, GameCreated)
    assert created.imported_from == "teeko-7" and created.tournament is None


def test_ordinary_games_keep_their_bytes() -> None:
    created = unpack(play("hexade", seed=1)[0].data)
    assert "imported_from" not in created
    model = decode_event(msgpack.packb(created, use_bin_type=True))
    assert isinstance(model, GameCreated) and model.imported_from is None
    assert encode(model) == msgpack.packb(created, use_bin_type=True)


def _rejected(entries: list[LogEntry] | ImportGame, match: str) -> None:
    cmd = entries if isinstance(entries, ImportGame) else _import(entries)
    with pytest.raises(Reject) as info:
        RULES.decide(None, cmd, now=1)
    assert info.value.code == "invalid_import"
    assert "\n" not in info.value.message
    assert re.search(match, info.value.message), info.value.message


def test_the_engine_refuses_tampered_and_unfinished_logs(teeko: list[LogEntry]) -> None:
    datas = [e.data for e in teeko]
    i = _first(teeko, "move_played")
    ev = unpack(datas[i])
    ev["move"] = unpack(datas[i + 1])["move"]
    tampered = [*teeko]
    tampered[i] = LogEntry(i + 1, msgpack.packb(ev, use_bin_type=True))
    _rejected(tampered, rf"^cannot import: game teeko-7 entry {i + 2}: prev_hash .* more\)$")
    assert rechain(datas, 0) == datas  # re-chaining a clean log changes nothing
    dropped = teeko[:5] + [LogEntry(n, e.data) for n, e in enumerate(teeko[6:], start=6)]
    _rejected(dropped, r"entry 6: event seq 7, expected 6")
    unfinished = play("teeko", seed=7, stop_after=10)
    _rejected(unfinished, r"has not ended \(its last event, seq 14, is move_played\)")
    _rejected(teeko[:-1], r"the rules ended the game but the log has no game_ended")
    other = ImportGame(command_id="x", game_id="n", events=[{"type": "game_created", "v": 1}])
    _rejected(other, r"^cannot import: game \? entry 1: undecodable event")
    with pytest.raises(Reject) as info:
        RULES.decide(RULES.decide(None, _import(teeko), 1).record, _import(teeko), now=1)
    assert info.value.code == "stale_seq" and "already exists" in info.value.message


def test_a_long_game_imports_beyond_the_ordinary_entry_size() -> None:
    entries = play("teeko", seed=3, options={"markers": "4"})  # 488 plies
    cmd = _import(entries)
    data = encode(cmd)
    assert MAX_ENTRY_BYTES < len(data) <= MAX_IMPORT_BYTES
    assert decode_command(data) == cmd
    assert RULES.decide(None, decode_command(data), 1).record.fold.status == "ended"
    # Only an import may be that large; and an import only up to its own bound.
    padded = encode(
        PlayMove(command_id="c", game_id="g", seat=1, token="t", move="C3", expected_seq=0)
    )
    big = msgpack.unpackb(padded) | {"pad": "x" * MAX_ENTRY_BYTES}
    with pytest.raises(DecodeError) as error:
        decode_command(msgpack.packb(big))
    assert error.value.code == "too_large"
    huge = msgpack.unpackb(data) | {"pad": "x" * MAX_IMPORT_BYTES}
    with pytest.raises(DecodeError) as error:
        decode_command(msgpack.packb(huge))
    assert error.value.code == "too_large"


def test_import_command_names_a_bad_line(teeko: list[LogEntry]) -> None:
    lines = _lines(teeko)
    lines[4] = "{"
    with pytest.raises(ExportError, match=r"^line 5: not JSON"):
        import_command("\n".join(lines), "n", "c")
    cmd = import_command("\n".join(_lines(teeko)), "n", "c", reply_to="r")
    assert cmd.events == events(teeko) and cmd.reply_to == "r"


# -- import through the pipeline (a real redis-server) -------------------------------------------
async def _submit(redis: aioredis.Redis, services: ServiceSet, cmd: ImportGame) -> Reply:
    reply_to = KEYS.reply_stream("export-test")
    cmd = cmd.model_copy(update={"reply_to": reply_to})
    await CommandClient(redis, KEYS).send([cmd])
    await services.drain()
    for _, fields in reversed(await redis.xrange(reply_to)):
        reply = decode_reply(fields[FIELD_BYTES])
        if reply.command_id == cmd.command_id:
            return reply
    raise AssertionError(f"no reply to {cmd.command_id}")


async def test_import_through_the_pipeline(redis: aioredis.Redis) -> None:
    services = ServiceSet(redis, KEYS, ["random"])
    [gid] = await create_games(redis, KEYS, [("supply-chains", {})], 1, ["random", "random"])
    await services.drain()
    query = QueryClient(redis, KEYS)
    original = await query.log(gid)
    text = export_jsonl(original)
    assert verify_export(text) == (gid, len(original), [])

    cmd = import_command(text, "imported-1", "import-1")
    reply = await _submit(redis, services, cmd)
    assert reply == Accepted(command_id="import-1", game_id="imported-1", seq=len(original))
    log = await query.log("imported-1")
    assert chain_problems("imported-1", log) == []
    assert [unpack(e.data)["move"] for e in log if unpack(e.data)["type"] == "move_played"] == [
        unpack(e.data)["move"] for e in original if unpack(e.data)["type"] == "move_played"
    ]
    first = decode_event(log[0].data)
    assert isinstance(first, GameCreated) and first.imported_from == gid
    seated = [decode_event(e.data) for e in log[1:3]]
    assert all(isinstance(s, PlayerSeated) for s in seated)

    old_view, view = await query.view(gid), await query.view("imported-1")
    assert old_view is not None and view is not None
    assert view["status"] == "ended" and view["imported_from"] == gid
    for key in ("result", "scores", "ply", "position", "seats", "seq", "created", "updated"):
        assert view[key] == old_view[key], key
    assert "imported_from" not in old_view
    assert (await query.ended(["imported-1"])) == [True]
    assert set(await query.game_ids()) == {gid, "imported-1"}

    # The same command again: the first reply, nothing appended.
    assert await _submit(redis, services, cmd) == reply
    assert len(await query.log("imported-1")) == len(original)
    # The id is taken now.
    again = import_command(text, "imported-1", "import-2")
    taken = await _submit(redis, services, again)
    assert isinstance(taken, Rejected) and taken.code == "stale_seq"

    report = await verify(redis, KEYS)
    assert report.problems == [] and report.games == 2
    live = await snapshot(redis, KEYS)
    await rebuild(redis, KEYS)
    assert compare_read_models(live, await snapshot(redis, KEYS)) == []
    exported = export_jsonl(await query.log("imported-1"))
    assert verify_export(exported) == ("imported-1", len(original), [])


async def test_a_tampered_import_is_rejected_and_leaves_nothing(redis: aioredis.Redis) -> None:
    services = ServiceSet(redis, KEYS, ["random"])
    [gid] = await create_games(redis, KEYS, [("teeko", {})], 1, ["random", "random"])
    await services.drain()
    lines = export_jsonl(await QueryClient(redis, KEYS).log(gid)).splitlines()
    i = next(n for n, line in enumerate(lines) if '"type":"move_played"' in line)
    ev = json.loads(lines[i])
    ev["move"] = json.loads(lines[i + 1])["move"]
    lines[i] = json.dumps(ev, separators=(",", ":"))
    reply = await _submit(redis, services, import_command("\n".join(lines), "forged", "f1"))
    assert isinstance(reply, Rejected) and reply.code == "invalid_import"
    assert reply.message.startswith(f"cannot import: game {gid} entry {i + 2}: prev_hash")
    unfinished = "\n".join(lines[: i - 1])
    reply = await _submit(redis, services, import_command(unfinished, "forged", "f2"))
    assert isinstance(reply, Rejected) and reply.code == "invalid_import"
    assert "has not ended" in reply.message
    query = QueryClient(redis, KEYS)
    assert await query.log("forged") == [] and await query.game_ids() == [gid]
    assert (await verify(redis, KEYS)).problems == []
