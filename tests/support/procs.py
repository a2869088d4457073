"""Agon's services as real OS processes, for tests that kill them with -9 and start them again.

A thin wrap of the benchmarks' fleet (`bench.fleet`) with the tests' habits:
`Processes.start("engine")` runs `python -m services.cli engine --redis-url URL -v` with its
output in a file and returns once the process says it is ready (the one ready line every
service logs), unless `wait=False`; a process that does not get ready fails the test with its
output. `kill(proc)` is SIGKILL: no shutdown work at all. Every process is stopped when the
block ends, SIGTERM first; the logs stay, for the test to read, in `SESSION_DIR` (which the
tests' session removes when every test passed).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.fleet import ROOT, Fleet, FleetError
from bench.fleet import Service as Proc

__all__ = ["ROOT", "SESSION_DIR", "Proc", "Processes"]

#: What the tests' session leaves on disk (the processes' logs, the arena file): one
#: directory, removed at the session's end unless a test failed.
SESSION_DIR = Path(tempfile.mkdtemp(prefix="agon-tests-"))


class Processes:
    """Agon service processes against one Redis URL (use as a context manager)."""

    def __init__(self, url: str, *, ready_timeout_s: float = 60.0) -> None:
        self.url = url
        self.fleet = Fleet(
            url, verbose=True, name="procs", ready_timeout_s=ready_timeout_s, root=SESSION_DIR
        )

    @property
    def procs(self) -> list[Proc]:
        return self.fleet.started

    def start(self, kind: str, *args: str, wait: bool = True) -> Proc:
        proc = self.fleet.start(kind, *args)
        if wait:
            self.wait_ready(proc)
        return proc

    def wait_ready(self, proc: Proc) -> None:
        try:
            self.fleet.wait_ready([proc])
        except FleetError as exc:
            raise AssertionError(f"{exc}:\n{proc.text()[-2000:]}") from None

    def kill(self, proc: Proc) -> None:
        """SIGKILL: the process does no shutdown work (no ack, no goodbye, no heartbeat)."""
        self.fleet.kill(proc)

    def restart(self, proc: Proc) -> Proc:
        """The same command again, as a new process."""
        fresh = self.fleet.restart(proc)
        self.wait_ready(fresh)
        return fresh

    def died(self) -> list[Proc]:
        """Processes that failed though nobody stopped them (a crash; a one-shot command
        such as `rebuild` that ends with status 0 is done, not dead)."""
        return [p for p in self.procs if not p.alive and p.process.returncode not in (0, -9)]

    def stop(self) -> None:
        self.fleet.close(keep=True)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def processes_with(text: str) -> list[int]:
    """The pids of running processes whose command line holds `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(int(proc.name))
    return found
