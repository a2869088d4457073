"""Agon's services as real OS processes, for tests that kill them with -9 and start them again.

`Processes.start("engine")` runs `python -m services.cli engine --redis-url URL -v` with its
output in a file and returns once the process says it is ready (a consumer's "ready" line,
the gateway's "serving" line). `kill(proc)` is SIGKILL: no shutdown work at all. Every process
is stopped when the block ends, SIGTERM first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[1]
#: What each kind prints when it is ready (stderr log line, or the gateway's stdout line).
READY = ("ready", "serving http")


@dataclass
class Proc:
    kind: str
    args: tuple[str, ...]
    output: Path
    process: subprocess.Popen[bytes]

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def text(self) -> str:
        return self.output.read_text(errors="replace")


class Processes:
    """Agon service processes against one Redis URL (use as a context manager)."""

    def __init__(self, url: str, *, ready_timeout_s: float = 60.0) -> None:
        self.url = url
        self.ready_timeout_s = ready_timeout_s
        self.directory = Path(tempfile.mkdtemp(prefix="agon-procs-"))
        self.procs: list[Proc] = []

    def start(self, kind: str, *args: str, wait: bool = True) -> Proc:
        output = self.directory / f"{kind}-{len(self.procs)}.log"
        command = [sys.executable, "-m", "services.cli", kind, "--redis-url", self.url, "-v"]
        with output.open("wb") as sink:
            process = subprocess.Popen(
                [*command, *args],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        proc = Proc(kind, args, output, process)
        self.procs.append(proc)
        if wait:
            self.wait_ready(proc)
        return proc

    def wait_ready(self, proc: Proc) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while not any(word in proc.text() for word in READY):
            if not proc.alive:
                raise AssertionError(f"{proc.kind} exited with {proc.process.returncode}:\n"
                                     + proc.text()[-2000:])  # fmt: skip
            if time.monotonic() > deadline:
                raise AssertionError(f"{proc.kind} not ready in time:\n" + proc.text()[-2000:])
            time.sleep(0.05)

    def kill(self, proc: Proc) -> None:
        """SIGKILL: the process does no shutdown work (no ack, no goodbye, no heartbeat)."""
        with contextlib.suppress(ProcessLookupError):
            proc.process.send_signal(signal.SIGKILL)
        proc.process.wait(timeout=10)

    def restart(self, proc: Proc) -> Proc:
        """The same command again, as a new process."""
        if proc.alive:
            self.kill(proc)
        return self.start(proc.kind, *proc.args)

    def died(self) -> list[Proc]:
        """Processes that failed though nobody stopped them (a crash; a one-shot command
        such as `rebuild` that ends with status 0 is done, not dead)."""
        return [p for p in self.procs if not p.alive and p.process.returncode not in (0, -9)]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.alive:
                proc.process.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.process.kill()
                proc.process.wait(timeout=5)

    def __enter__(self) -> Processes:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
