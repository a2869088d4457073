"""The one process fleet: Agon's services as OS processes, for the benchmarks and the tests.

Each process runs `python -m services.cli <kind> --redis-url URL [--prefix P] [-v] ...` as an
operator would (or a benchmark's helper, `python -m bench.<module> <kind> ...`, the same way),
with its output (stdout and stderr) in a log file of its own, in a session of its own (a
Ctrl-C reaches only the owner, which stops them in order), and dies with its owner even if
that is killed (Linux). A gateway started without `--port` gets a free one on the loopback.

A process is ready once it logs the line every service logs when it is, `<its name> ready:
<what it does>` (`agon up`, every service in one process, once it says `agon up: ready`); one
that exits or stays silent first is a `FleetError` naming its log. `kill` is SIGKILL (no
shutdown work at all), `restart` the same command again as a new process; `stop`, `close`
and leaving the `with` block (however) stop every one still running: SIGCONT (a paused one),
SIGTERM, then SIGKILL after the stop timeout. The logs are removed at the end unless one
logged an error (or the owner keeps them). `delete_keys` removes a run's key space from a
Redis the benchmark was lent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.bus.connection import Client, scan_keys
from services.bus.embedded import _die_with_parent, free_port, stop_process
from services.bus.keys import Keys
from services.cli.options import UsageError

ROOT = Path(__file__).resolve().parents[1]
#: What every service logs once it is ready: `<its name> ready: <what it does>`.
READY = " ready: "
#: ... and what `agon up` says once all of its services are (its gateway serves).
UP_READY = "agon up: ready"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
#: How long a process killed with SIGKILL may take to be reaped.
KILLED_WAIT_S = 10.0


class FleetError(RuntimeError):
    """A process exited, or stayed silent, before it said it was ready."""


@dataclass
class Service:
    """One `agon <kind>` process, its output in `log`."""

    kind: str
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    args: tuple[str, ...] = ()
    module: str = "services.cli"
    port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")


class Fleet:
    """Service processes against one Redis (and one key prefix, unless it is ""): `verbose`
    runs them with -v, `env` adds to their environment, `name` names the logs' directory."""

    def __init__(
        self,
        url: str,
        prefix: str = "",
        *,
        verbose: bool = False,
        env: Mapping[str, str] | None = None,
        name: str = "fleet",
        ready_timeout_s: float = READY_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        root: Path | None = None,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.options = (*(("--prefix", prefix) if prefix else ()), *(("-v",) if verbose else ()))
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        #: the processes' logs, in `root` when given (else the system's temporary directory)
        self.dir = Path(tempfile.mkdtemp(prefix=f"agon-{name}-", dir=root))
        self.running: list[Service] = []
        #: every process ever started, so that a caller can check none outlives the run
        self.started: list[Service] = []
        self._numbers: Counter[str] = Counter()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        # After a failure the logs are what tells why: they stay (its message names them).
        failed = kind is not None and not issubclass(kind, KeyboardInterrupt | UsageError)
        self.close(keep=failed and any(self.dir.iterdir()))

    def start(self, kind: str, *args: str, module: str = "services.cli") -> Service:
        """Start one process (not waiting for it: `ready`, `wait_ready`)."""
        self._numbers[kind] += 1
        number = self._numbers[kind]
        log = self.dir / f"{kind}-{number}.log"
        port = None
        if kind == "gateway":
            if "--port" not in args:
                args = (*args, "--host", "127.0.0.1", "--port", str(free_port()))
            port = int(args[args.index("--port") + 1])
        # -v is the CLI's: another module (`bench.gateway`) takes no such option.
        options = [o for o in self.options if module == "services.cli" or o != "-v"]
        argv = [sys.executable, "-m", module, kind, "--redis-url", self.url, *options]
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*argv, *args],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # preexec_fn is unsafe only with threads forking at once.
                preexec_fn=_die_with_parent,
            )
        service = Service(kind, f"{kind} {number}", process, log, args, module, port)
        self.running.append(service)
        self.started.append(service)
        return service

    def _ready(self, service: Service, deadline: float) -> bool:
        """Whether it said it is ready; a `FleetError` if it exited or the deadline passed."""
        text = service.text()
        if (UP_READY if service.kind == "up" else READY) in text:
            return True
        code = service.process.poll()
        if code is not None or time.monotonic() > deadline:
            last = (text.strip().splitlines() or ["no output"])[-1]
            state = f"exited with {code}" if code is not None else "was not ready"
            raise FleetError(f"`agon {service.kind}` {state}: {last} ({service.log})")
        return False

    def _not_ready(self, services: Sequence[Service], deadline: float) -> list[Service]:
        return [s for s in services if not self._ready(s, deadline)]

    async def ready(self, services: Sequence[Service]) -> None:
        """Wait until each says it is ready, without holding up the event loop."""
        waiting, deadline = list(services), time.monotonic() + self.ready_timeout_s
        while waiting := self._not_ready(waiting, deadline):
            await asyncio.sleep(0.05)

    def wait_ready(self, services: Sequence[Service]) -> None:
        """Wait until each says it is ready (outside an event loop)."""
        waiting, deadline = list(services), time.monotonic() + self.ready_timeout_s
        while waiting := self._not_ready(waiting, deadline):
            time.sleep(0.05)

    def of(self, kind: str) -> list[Service]:
        return [s for s in self.running if s.kind == kind]

    async def scale(self, kind: str, count: int, *args: str) -> list[Service]:
        """Exactly `count` processes of `kind` running (the newest stopped first)."""
        now = self.of(kind)
        if len(now) > count:
            await self.stop_soon(now[count:])
        started = [self.start(kind, *args) for _ in range(count - len(now))]
        await self.ready(started)
        return self.of(kind)

    def pause(self, service: Service) -> None:
        service.process.send_signal(signal.SIGSTOP)

    def resume(self, service: Service) -> None:
        if service.alive:
            service.process.send_signal(signal.SIGCONT)

    def kill(self, service: Service) -> None:
        """SIGKILL: the process does no shutdown work (no ack, no goodbye, no heartbeat)."""
        with contextlib.suppress(ProcessLookupError):
            service.process.send_signal(signal.SIGKILL)
        service.process.wait(timeout=KILLED_WAIT_S)
        self._forget(service)

    def restart(self, service: Service) -> Service:
        """The same command again, as a new process (the old one killed if it still runs)."""
        if service.alive:
            self.kill(service)
        return self.start(service.kind, *service.args, module=service.module)

    def _terminate(self, services: Sequence[Service]) -> float:
        """SIGCONT (a paused process would not see the rest) and SIGTERM; the deadline."""
        for s in services:
            if s.alive:
                s.process.send_signal(signal.SIGCONT)
                s.process.send_signal(signal.SIGTERM)
        return time.monotonic() + self.stop_timeout_s

    def _reaped(self, service: Service, timeout_s: float) -> None:
        stop_process(service.process, timeout_s, terminated=True)
        self._forget(service)

    def _forget(self, service: Service) -> None:
        if service in self.running:
            self.running.remove(service)

    def stop(self, services: Sequence[Service]) -> None:
        """Stop them, waiting (outside the event loop: `close`)."""
        deadline = self._terminate(services)
        for s in services:
            self._reaped(s, max(0.1, deadline - time.monotonic()))

    async def stop_soon(self, services: Sequence[Service]) -> None:
        """Stop them without holding up the event loop: the feeds must be read meanwhile
        (entries every group has acknowledged are trimmed within seconds)."""
        deadline = self._terminate(services)
        while time.monotonic() < deadline and any(s.alive for s in services):
            await asyncio.sleep(0.05)
        for s in services:
            self._reaped(s, 0.0)

    def errors(self) -> dict[str, Any]:
        """The processes that logged an error (ERROR lines, tracebacks): count and last line."""
        out: dict[str, Any] = {}
        for path in sorted(self.dir.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()
            bad = [line for line in lines if " ERROR " in line or line.startswith("Traceback")]
            if bad:
                out[path.stem] = {"errors": len(bad), "last": bad[-1][:200]}
        return out

    def close(self, keep: bool = False) -> None:
        """Stop every process still running; remove the logs unless one logged an error
        (or `keep`)."""
        self.stop(list(self.running))
        if not keep and not self.errors():
            shutil.rmtree(self.dir, ignore_errors=True)


async def delete_keys(redis: Client, keys: Keys) -> None:
    """Remove every key of the benchmark's key space from a Redis it was lent."""
    names = [name async for name in scan_keys(redis, f"{keys.prefix}:*")]
    for lo in range(0, len(names), 1000):
        pipe = redis.pipeline(transaction=False)
        for name in names[lo : lo + 1000]:
            pipe.unlink(name)
        await pipe.execute()
