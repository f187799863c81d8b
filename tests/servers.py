"""Real PostgreSQL and Redis servers for the store tests, each of its own.

Each server runs on 127.0.0.1 on a free port, from Debian's binaries, as an
unprivileged process with its data in a temporary directory (as the
``postgres`` / ``redis`` system user when the tests run as root: initdb
refuses root). The fixtures in ``conftest.py`` start one of each per test
session, wait until it answers and stop it at the end. When the binaries are
absent the tests that need them are skipped with a message, except with
``THREADLINE_REQUIRE_INTEGRATION=1`` (CI), where a missing server fails.

Both servers ask for a password, so the tests prove it never leaks.

No pytest here: ``benchmarks/bench_stores.py`` starts its servers with this
module and runs with the ``bench`` extra alone.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "PASSWORD",
    "PostgresServer",
    "RedisServer",
    "assert_no_password",
    "user_document",
]

PASSWORD = "s3cret-Pa55word"
"""The password both servers ask for; no test output may ever show it."""

STARTUP_SECONDS = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _service_user(name: str) -> pwd.struct_passwd | None:
    """The unprivileged user to run a server as when we are root; ``None`` otherwise."""
    if os.geteuid() != 0:
        return None
    for candidate in (name, "nobody"):
        try:
            return pwd.getpwnam(candidate)
        except KeyError:
            continue
    raise RuntimeError("running as root and no unprivileged user to start the server as")


def _private_dir(prefix: str, user: pwd.struct_passwd | None) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    if user is not None:
        os.chown(directory, user.pw_uid, user.pw_gid)
    return directory


def _as_user(user: pwd.struct_passwd | None) -> dict[str, Any]:
    """``subprocess`` arguments that run the server as ``user`` (when we are root)."""
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _wait_until(answers: Callable[[], bool], process: subprocess.Popen[bytes], what: str) -> None:
    """Poll the server until it answers; fail when it exits or takes too long."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} while starting")
        if answers():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer within {STARTUP_SECONDS:.0f} s")


class _Server:
    """A server process of the tests' own: stop it, restart it, remove its directory."""

    _root: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        raise NotImplementedError

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (SIGKILL: a crash)."""
        process, self.process = self.process, None
        if process is None:
            return
        process.send_signal(sig)
        process.wait(timeout=60)

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self._root, ignore_errors=True)


class PostgresServer(_Server):
    """One PostgreSQL cluster in a temporary directory; ``url`` reaches it as ``threadline``."""

    def __init__(self, bindir: Path, *, fsync: bool = False) -> None:
        self._bindir = bindir
        self._fsync = fsync
        self._user = _service_user("postgres")
        self._root = _private_dir("threadline-pg-", self._user)
        self.data = self._root / "data"
        self.port = free_port()
        self._databases = 0

    @classmethod
    def find(cls) -> Path | None:
        """The directory of Debian's PostgreSQL binaries, newest version first."""
        for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
            if (Path(bindir) / "initdb").exists() and (Path(bindir) / "postgres").exists():
                return Path(bindir)
        found = shutil.which("initdb")
        return Path(found).parent if found and shutil.which("postgres") else None

    def url(self, database: str = "postgres", *, password: str = PASSWORD) -> str:
        return f"postgresql://threadline:{password}@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        pwfile = self._root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self._user is not None:
            os.chown(pwfile, self._user.pw_uid, self._user.pw_gid)
        subprocess.run(
            [
                str(self._bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "threadline",
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "--no-sync",
                "-E",
                "UTF8",
            ],
            **_as_user(self._user),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self._root,
        )
        pwfile.unlink()

    def start(self) -> None:
        if not self.data.exists():
            self.init()
        self.process = subprocess.Popen(
            [
                str(self._bindir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-h",
                "127.0.0.1",
                "-k",
                str(self._root),
                "-c",
                "max_connections=300",
                "-c",
                # A test cluster: durability is not what the tests measure (benchmarks keep it).
                f"fsync={'on' if self._fsync else 'off'}",
            ],
            **_as_user(self._user),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self._root,
        )
        _wait_until(self._answers, self.process, "PostgreSQL")

    def _answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def stop(self, sig: int = signal.SIGINT) -> None:
        """Stop the server (SIGINT, the default: a fast shutdown; SIGKILL: a crash)."""
        super().stop(sig)

    def create_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        self._databases += 1
        name = f"t{self._databases}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return self.url(name)


class RedisServer(_Server):
    """One Redis server with no persistence; ``url`` reaches it with the password."""

    def __init__(self, binary: str, *options: str) -> None:
        self._binary = binary
        self._options = list(options)
        self._user = _service_user("redis")
        self._root = _private_dir("threadline-redis-", self._user)
        self.port = free_port()

    @classmethod
    def find(cls) -> str | None:
        return shutil.which("redis-server")

    def url(self, *, password: str = PASSWORD) -> str:
        return f"redis://:{password}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self._binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._root),
                "--requirepass",
                PASSWORD,
                "--maxclients",
                "1000",
                *self._options,
            ],
            **_as_user(self._user),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self._root,
        )
        _wait_until(self._answers, self.process, "Redis")

    def _answers(self) -> bool:
        import redis

        client = redis.Redis.from_url(self.url(), socket_connect_timeout=2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()


def paused_script_client(admin: Any, but_not: str | None = None) -> str:
    """The client id of a connection whose script (``EVALSHA``) waits on a ``CLIENT
    PAUSE``, as ``admin`` (a redis-py client) lists them, other than ``but_not``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for client in admin.client_list():
            if client["cmd"] == "evalsha" and "b" in client["flags"] and client["id"] != but_not:
                return str(client["id"])
        time.sleep(0.02)
    raise AssertionError("no script call reached the server")


def user_document(conversation_id: str = "c1", *texts: str) -> Any:
    """A ``ConversationDocument`` whose transcript is ``texts`` as user messages."""
    from threadline import Message, Origin
    from threadline.serialization import ConversationDocument, ConversationEvent

    return ConversationDocument(
        id=conversation_id,
        next_turn_id=len(texts) + 1,
        events=tuple(
            ConversationEvent(message=Message.user(text, origin=Origin.TURN), turn_id=index)
            for index, text in enumerate(texts)
        ),
    )


def assert_no_password(error: BaseException, *texts: str, password: str = PASSWORD) -> None:
    """Neither ``error`` (its chain included, traceback and all) nor ``texts`` hold ``password``."""
    import traceback

    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        for text in (str(link), repr(link), repr(link.args)):
            assert password not in text, f"the password leaked into {type(link).__name__}"
        link = link.__cause__ or link.__context__
    rendered = "".join(traceback.format_exception(error))
    assert password not in rendered
    for text in texts:
        assert password not in text
