"""``RedisStore`` itself: the store's calls, each one Lua script (``_scripts``),
sent through ``_calls``."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import anyio.lowlevel
import anyio.to_thread

from threadline._errors import (
    ConversationFormatError,
    ConversationNotFoundError,
    InvalidRequestError,
    StoreError,
)
from threadline._store import ConversationInfo, StoredConversation
from threadline.serialization._converter import FORMAT_VERSION
from threadline.stores._base import DeleteCheck, StoreBase, Write, check_turn_ids_below
from threadline.stores._parts import assemble, read_count, read_metadata, stored_conversation
from threadline.stores._remote import RemoteTarget, on_asyncio
from threadline.stores.redis import _scripts as scripts

try:
    import redis
    import redis.asyncio
    import redis.asyncio.retry
    import redis.backoff
    import redis.exceptions
    import redis.retry
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("RedisStore needs redis-py: pip install 'threadline[redis]'") from exc

from threadline.stores.redis._calls import ScriptCalls  # imports redis-py, found above

__all__ = ["SCHEMA_VERSION", "RedisStore"]

# A pending event in a conversation's list: "p<seq>\t<marker>\t<JSON>" (the layout
# in _scripts); anything else in the list is an answered event's JSON.
_PENDING_ITEM: Final = re.compile(r"p\d+\t(?P<marker>[^\t]*)\t(?P<event>.*)", re.DOTALL)

SCHEMA_VERSION: Final = scripts.SCHEMA_VERSION

_SCRIPTS: Final = {
    "open": scripts.OPEN,
    "write": scripts.WRITE,
    "load": scripts.LOAD,
    "list_page": scripts.LIST_PAGE,
    "remove_pending": scripts.REMOVE_PENDING,
    "delete": scripts.DELETE,
}


class RedisStore(StoreBase):
    """A :class:`~threadline._store.ConversationStore` in Redis.

    ``url`` is a ``redis://[:password@]host:port/db`` (or ``rediss://`` for
    TLS) URL. Every key starts with ``prefix``, so several applications can
    share one server. Each call is one Lua script, which Redis runs with no
    other command in between: the version check and the write are one atomic
    step, so of two writers based on the same version exactly one succeeds;
    the others get ``ConcurrentModificationError`` and change nothing.
    Listing walks a sorted index page by page (never ``KEYS``).

    ``ttl``: when given, a conversation expires that many seconds after its
    last write (every write renews it); ``None`` keeps conversations until
    they are deleted.

    Under asyncio the store uses redis-py's async connections; under trio,
    where they do not run, its blocking client in worker threads. ``timeout``
    bounds a call: on asyncio the whole call (waiting for a free connection,
    connecting, the answer), in a worker thread each of those waits; a server
    gone silent included, past it the call raises ``StoreError``. A call
    cancelled while its script runs waits for it, within that bound. A write
    is one script call, one round trip (a conversation's turn is two: its
    pending prompt, then its commit). A write whose connection is lost is
    retried once, safely: a retried write that had been applied is recognised.
    On asyncio the calls tasks make at the same moment go to the server
    together, each still its own script (``_calls``); ``max_connections``
    bounds the connections, so the batches in flight.

    Raises (from any call):
        StoreError: the server cannot be reached, refuses the password, lost
            the connection, or the keys under ``prefix`` are not this store's;
            the message names the store (never the password) and what to do.
        ConversationFormatError: the keys were written by a newer threadline
            (a newer schema version), or a stored event is damaged.
        StoreClosedError: the store was closed with :meth:`aclose`.

    Example::

        async with RedisStore("redis://:secret@cache.internal:6379/0", prefix="support:") as store:
            stored = await store.load("support-42")
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "threadline:",
        ttl: float | None = None,
        max_connections: int = 50,
        timeout: float = 10.0,
    ) -> None:
        self._target = RemoteTarget(url, schemes=("redis", "rediss"), store="RedisStore")
        if not isinstance(prefix, str):
            raise InvalidRequestError(f"prefix is a str, not {type(prefix).__name__}")
        if ttl is not None and (not isinstance(ttl, int | float) or ttl <= 0):
            raise InvalidRequestError(f"ttl is a number of seconds > 0 or None, not {ttl!r}")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise InvalidRequestError(f"max_connections is an int >= 1, not {max_connections!r}")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise InvalidRequestError(f"timeout is a number of seconds > 0, not {timeout!r}")
        self._prefix = prefix
        self._shared = [f"{prefix}index", f"{prefix}touched"]  # the keys every conversation shares
        self._ttl_ms = 0 if ttl is None else max(1, round(ttl * 1000))
        self._max_connections = max_connections
        self._timeout = float(timeout)
        self._ready = False
        self._ready_lock = anyio.Lock()
        self._async_calls_made: ScriptCalls | None = None
        self._sync_client: redis.Redis | None = None
        self._sync_scripts: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"RedisStore({self._target.shown!r}, prefix={self._prefix!r})"

    @property
    def prefix(self) -> str:
        """What every key of this store starts with."""
        return self._prefix

    def _keys(self, conversation_id: str) -> list[str]:
        return [f"{self._prefix}{kind}:{conversation_id}" for kind in ("c", "e", "p")]

    # --- the backend ---------------------------------------------------------------

    async def _load(self, conversation_id: str) -> StoredConversation:
        found = await self._call("load", self._keys(conversation_id)[:2], [], conversation_id)
        if not found:
            raise ConversationNotFoundError(conversation_id)
        version, generation, header, items = found
        events: list[tuple[Any, ...]] = []
        markers: list[str] = []
        for seq, item in enumerate(items):
            pending = _PENDING_ITEM.fullmatch(item)
            if pending is None:  # an answered event's JSON; anything else fails to parse
                events.append((seq, item))
            else:
                events.append((seq, pending["event"]))
                markers.append(pending["marker"])
        return stored_conversation(
            conversation_id,
            assemble(conversation_id, header, events),
            version=version,
            generation=generation,
            markers=markers,
        )

    async def _write(self, write: Write) -> int:
        # Packed into few arguments (the layout is WRITE's, in _scripts): a call's
        # client-side cost grows with its argument count, and a turn makes two writes.
        fields = (
            f"{write.expected_version}\t{write.generation or ''}\t{write.write_id}\t"
            f"{int(write.replace)}\t{int(write.drop_all)}\t{write.drop_marker or ''}\t"
            f"{FORMAT_VERSION}\t{write.header.next_turn_id}\t{self._ttl_ms}"
        )
        heads = "".join(
            f"{record.turn_id}\t{int(record.pending)}\t{record.marker or ''}\n"
            for record in write.records
        )
        args = [
            write.conversation_id,
            fields,
            write.header_text,
            json.dumps(write.header.metadata) if write.header.metadata else "{}",
            heads,
            *(record.text for record in write.records),
        ]
        keys = [*self._keys(write.conversation_id), *self._shared_keys()]
        answer = await self._call("write", keys, args, write.conversation_id)
        if isinstance(answer, int):  # applied: the new version
            return answer
        status, _, rest = str(answer).partition("\t")
        version, _, detail = rest.partition("\t")
        if status == "damaged":
            field, _, value = str(detail).partition("=")
            read_count(write.conversation_id, field, value)  # raises, naming both
        if status == "conflict":
            raise write.conflict(None if int(version) < 0 else int(version))
        if status == "generation":
            raise write.generation_refusal(detail, int(version))
        if status == "turn":
            check_turn_ids_below(int(detail), write.header)
        if status == "format":
            raise StoreError(
                f"{self!r}: conversation {write.conversation_id!r} was written in saved "
                f"format {detail} and this threadline writes format {FORMAT_VERSION}; load "
                f"it and save it whole (store.save) to bring it to the current format"
            )
        raise StoreError(f"{self!r}: the write script answered {status!r}")

    async def _list_page(self, limit: int, after: int | None) -> list[tuple[ConversationInfo, int]]:
        rows = await self._call(
            "list_page",
            [self._shared_keys()[0]],
            [self._prefix, "+inf" if after is None else after, limit],
        )
        return [_listed(*row) for row in rows]

    async def _remove_pending(self, conversation_id: str, marker: str) -> bool:
        keys = self._keys(conversation_id)
        return bool(await self._call("remove_pending", keys, [marker], conversation_id))

    async def _delete(self, check: DeleteCheck) -> bool:
        keys = [*self._keys(check.conversation_id), self._shared_keys()[0]]
        expected = "" if check.expected_version is None else str(check.expected_version)
        status, version, generation = await self._call(
            "delete", keys, [check.conversation_id, expected, check.generation or ""]
        )
        if status >= 0:
            return bool(status == 1)
        # Not deleted: what is stored differs, or cannot be compared (damaged).
        stored = read_count(check.conversation_id, "version", version, least=1)
        refusal = check.refusal(stored, str(generation))
        assert refusal is not None  # the script found a difference
        raise refusal

    async def _close(self) -> None:
        async with self._ready_lock:
            async_calls, self._async_calls_made = self._async_calls_made, None
            sync_client, self._sync_client = self._sync_client, None
            if async_calls is not None:
                await async_calls.aclose()
            if sync_client is not None:
                await anyio.to_thread.run_sync(sync_client.close)
                await anyio.to_thread.run_sync(sync_client.connection_pool.disconnect)

    def _shared_keys(self) -> list[str]:
        return self._shared

    # --- the connection --------------------------------------------------------------

    async def _call(
        self,
        script: str,
        keys: Sequence[str],
        args: Sequence[str | int],
        conversation_id: str | None = None,
    ) -> Any:
        """Run one script; errors become ``StoreError`` naming the store (and the
        conversation the call is about), never the password."""
        if not self._ready:
            await self._prepare()
        return await self._run_script(script, keys, args, conversation_id)

    async def _run_script(
        self,
        script: str,
        keys: Sequence[str],
        args: Sequence[str | int],
        conversation_id: str | None = None,
    ) -> Any:
        problem: redis.exceptions.RedisError
        try:
            if on_asyncio():
                # One deadline for the whole call rather than redis-py's socket_timeout,
                # which arms a timer for every send and every read (and, on Python 3.11,
                # starts a task for every send). Cut short at it, the call's connection
                # is closed, so no late answer is read as another call's.
                deadline = anyio.current_time() + self._timeout
                with anyio.CancelScope(shield=True, deadline=deadline):
                    return await self._async_calls().call(script, keys, args)
                problem = redis.exceptions.TimeoutError(f"no answer within {self._timeout:g} s")
            else:
                with anyio.CancelScope(shield=True):
                    return await anyio.to_thread.run_sync(
                        lambda: self._sync_script(script)(keys=keys, args=args)
                    )
        except redis.exceptions.RedisError as exc:
            problem = exc
        # A caller cancelled meanwhile gets its cancellation rather than the StoreError.
        await anyio.lowlevel.checkpoint_if_cancelled()
        raise self._error(problem, conversation_id)

    def _options(self, *, asynchronous: bool) -> dict[str, Any]:
        # A lost connection is retried once, on a fresh one (safe: each write
        # carries an id the script recognises); a server that refuses that too
        # is down, and the call says so at once. A silent connection is not
        # retried: its read already waited ``timeout``, all a call may take.
        lost = (redis.exceptions.ConnectionError,)
        backoff = redis.backoff.NoBackoff()
        if asynchronous:
            # The call's deadline bounds every wait (``_run_script``), and ScriptCalls
            # sends a batch again once itself when its connection is lost.
            return {
                "decode_responses": True,
                "socket_timeout": None,  # not redis-py's default of a few seconds
                "socket_connect_timeout": self._timeout,
                "retry": redis.asyncio.retry.Retry(backoff, 0),
            }
        return {
            "decode_responses": True,
            "socket_timeout": self._timeout,
            "socket_connect_timeout": self._timeout,
            "max_connections": self._max_connections,
            "timeout": self._timeout,  # how long to wait for a free connection
            "retry": redis.retry.Retry(backoff, 1, supported_errors=lost),
            "retry_on_error": list(lost),
        }

    def _async_calls(self) -> ScriptCalls:
        if self._async_calls_made is None:
            # The pool only makes the connections (it holds the URL's settings).
            pool = redis.asyncio.ConnectionPool.from_url(
                self._target.url, **self._options(asynchronous=True)
            )
            self._async_calls_made = ScriptCalls(
                pool, _SCRIPTS, max_connections=self._max_connections, timeout=self._timeout
            )
        return self._async_calls_made

    def _sync_script(self, name: str) -> Any:
        if self._sync_client is None:
            self._sync_client = redis.Redis(
                connection_pool=redis.BlockingConnectionPool.from_url(
                    self._target.url, **self._options(asynchronous=False)
                )
            )
            self._sync_scripts = {
                key: self._sync_client.register_script(lua) for key, lua in _SCRIPTS.items()
            }
        return self._sync_scripts[name]

    def _error(
        self, problem: redis.exceptions.RedisError, conversation_id: str | None
    ) -> StoreError:
        if isinstance(problem, redis.exceptions.AuthenticationError):
            return self._target.error(
                "RedisStore", "the server refused the login", problem, "check the URL's password"
            )
        if isinstance(problem, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
            return self._target.error(
                "RedisStore",
                "cannot reach the server",
                problem,
                "check that it runs at that address; a write in flight was applied once or "
                "not at all, load the conversation to see which",
            )
        if "WRONGTYPE" in str(problem):
            return self._target.error(
                "RedisStore",
                f"the keys under prefix {self._prefix!r} are not this store's",
                problem,
                "choose a prefix no other program writes under",
            )
        if conversation_id is None:
            return self._target.error(
                "RedisStore", "the server refused a script", problem, "see above"
            )
        # A script fails on keys it did not write: another program's, or damaged.
        return self._target.error(
            "RedisStore",
            f"the server refused a script on conversation {conversation_id!r}",
            problem,
            "its keys are damaged or not this store's; load it to see, or delete it",
        )

    # --- opening ---------------------------------------------------------------------

    async def _prepare(self) -> None:
        async with self._ready_lock:
            if self._ready:
                return
            self._check_open()
            stored = await self._run_script("open", [f"{self._prefix}schema"], [SCHEMA_VERSION])
            if stored < 1 or stored > SCHEMA_VERSION:
                raise ConversationFormatError(
                    f"{self!r}: the keys under the prefix have threadline schema version "
                    f"{stored}, "
                    + ("written by a newer threadline; " if stored > 1 else "")
                    + f"this one reads schema version {SCHEMA_VERSION}; "
                    + ("upgrade threadline to use them" if stored > 1 else "choose another prefix")
                )
            self._ready = True


def _listed(
    conversation_id: str,
    version: object,
    count: object,
    updated_at: object,
    metadata: object,
    generation: object,
    order: object,
) -> tuple[ConversationInfo, int]:
    """One row of the listing script, checked: damage is refused, naming the conversation."""
    try:
        moment = datetime.fromtimestamp(float(str(updated_at)), UTC)
    except (ValueError, OverflowError, OSError):
        raise ConversationFormatError(
            f"stored conversation {conversation_id!r}: updated_at {updated_at!r} is not a "
            f"time in seconds; the stored data is damaged",
            path="$.updated_at",
        ) from None
    info = ConversationInfo(
        id=conversation_id,
        version=read_count(conversation_id, "version", version, least=1),
        events=read_count(conversation_id, "count", count),
        updated_at=moment,
        metadata=read_metadata(conversation_id, metadata),
        generation=str(generation),
    )
    return info, read_count(conversation_id, "touched", order)
