"""What the server-backed stores (PostgreSQL, Redis) share: URLs without their
password, the choice of client per event loop, and errors that leak nothing.

The common async database clients run on asyncio only. A server store uses
its async client under asyncio and its blocking client in worker threads
(``anyio.to_thread``) under trio, so it works under both; :func:`on_asyncio`
tells which applies to the running task.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

from threadline._errors import InvalidRequestError, StoreError

__all__ = ["RemoteTarget", "on_asyncio"]


def on_asyncio() -> bool:
    """Whether the running task is on asyncio (else trio: use the blocking client)."""
    try:
        import sniffio
    except ImportError:  # trio depends on sniffio: without it the loop is asyncio's
        return True
    return bool(sniffio.current_async_library() == "asyncio")


class RemoteTarget:
    """A server URL, kept whole for connecting and shown only without its password.

    ``shown`` is the URL with the password replaced by ``***``; ``scrub``
    takes every copy of the password out of a text (a server's error, say)
    before it goes into an exception or a log line.
    """

    __slots__ = ("_password", "_url", "shown")

    def __init__(self, url: object, *, schemes: tuple[str, ...], store: str) -> None:
        if not isinstance(url, str) or not url:
            raise InvalidRequestError(f"{store} needs a server URL, not {type(url).__name__}")
        try:
            parts = urlsplit(url)
            port = parts.port  # a port that is not a number raises here
        except ValueError:
            raise InvalidRequestError(
                f"{store}: the URL is not of the form {schemes[0]}://user:password@host:port/..."
            ) from None
        if parts.scheme not in schemes:
            raise InvalidRequestError(
                f"{store} takes a URL starting with {' or '.join(s + '://' for s in schemes)}, "
                f"not {parts.scheme + '://' if parts.scheme else 'one without a scheme'}"
            )
        self._url = url
        self._password = unquote(parts.password) if parts.password else ""
        shown = parts
        if parts.password is not None:
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            user = parts.username or ""
            netloc = f"{user}:***@{host}" + (f":{port}" if port is not None else "")
            shown = parts._replace(netloc=netloc)
        self.shown = urlunsplit(shown._replace(query="", fragment=""))

    @property
    def url(self) -> str:
        """The URL as given, password included: for connecting only."""
        return self._url

    def scrub(self, text: str) -> str:
        """``text`` with the password (raw and percent-encoded) replaced by ``***``."""
        raw_password = urlsplit(self._url).password
        for secret in {self._password, raw_password or ""}:
            if secret:
                text = text.replace(secret, "***")
        return text

    def error(self, store: str, what: str, problem: BaseException | str, advice: str) -> StoreError:
        """A ``StoreError`` naming the store, what failed and what to do, with no password.

        Raise it outside the ``except`` block (or ``from None`` and with the
        context cleared) so the driver's exception, which may hold connection
        details, is not chained to it.
        """
        if isinstance(problem, BaseException):
            detail = str(problem).strip().splitlines()
            reason = f"{type(problem).__name__}: {detail[0] if detail else 'no detail'}"
        else:
            reason = problem
        return StoreError(self.scrub(f"{store}({self.shown!r}): {what}: {reason}; {advice}"))
