"""The exceptions threadline raises.

Everything threadline raises on purpose derives from one root, so
``except ThreadlineError`` catches all of it::

    ThreadlineError
    ├── InvalidRequestError        (also a ValueError) a request, message or
    │                              option that cannot be sent as given
    ├── HandlerError               a limiting handler returned a broken transcript
    ├── TranscriptIntegrityError   (also a ValueError) a tool unit is broken
    ├── MaxRoundsExceededError     the model kept calling tools past ``with_max_rounds``
    ├── ConversationFormatError    (also a ValueError) a saved document that cannot be loaded
    ├── ConcurrentModificationError  a store write based on a stale version
    ├── ConversationNotFoundError  (also a KeyError) a store has no such conversation
    ├── StoreError                 a store could not do its work (locked, unreachable)
    │   └── StoreClosedError           the store was closed with ``aclose()``
    ├── TokenizerDataError         the embedded vocabulary is missing or damaged
    ├── ToolArgumentsError         (also a ValueError) a tool call's arguments are not valid JSON
    ├── OutputValidationError      (also a ValueError) a structured answer failed its type
    ├── ToolError                  a tool's server could not start, or stopped during a call
    └── ProviderError              the provider failed; carries status, body, request id
        ├── AuthenticationError        401 / 403
        ├── RateLimitError             429
        ├── BadRequestError            400 / 404 / 422 the provider refused the request
        │   └── ContextLengthExceededError  the prompt did not fit the model's window
        ├── ProviderUnavailableError   5xx, time-outs and connection failures
        │   └── RequestTimeoutError        a call past its timeout or first_token_timeout
        └── ProviderResponseError      a response that is not what the protocol promises

A provider error carries the HTTP status, the response body and the request id
the provider gave, and never the API key: drivers build these errors from the
response, never from the request headers.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "ConcurrentModificationError",
    "ContextLengthExceededError",
    "ConversationFormatError",
    "ConversationNotFoundError",
    "HandlerError",
    "InvalidRequestError",
    "MaxRoundsExceededError",
    "OutputValidationError",
    "ProviderError",
    "ProviderResponseError",
    "ProviderUnavailableError",
    "RateLimitError",
    "RequestTimeoutError",
    "StoreClosedError",
    "StoreError",
    "ThreadlineError",
    "TokenizerDataError",
    "ToolArgumentsError",
    "ToolError",
    "TranscriptIntegrityError",
]


class ThreadlineError(Exception):
    """The root of every error threadline raises on purpose."""


class InvalidRequestError(ThreadlineError, ValueError):
    """A request, message or option that cannot be sent as given."""


class TranscriptIntegrityError(ThreadlineError, ValueError):
    """A transcript whose tool units are broken.

    ``index`` is the position of the first broken message, ``reason`` says what
    is wrong with it.
    """

    def __init__(self, reason: str, *, index: int) -> None:
        super().__init__(f"message {index}: {reason}")
        self.reason = reason
        self.index = index


class HandlerError(ThreadlineError):
    """A limiting handler left a transcript the engine refuses to send.

    ``handler`` names the handler, ``index`` the first broken message of its
    output (or ``None`` when a pinned message went missing).
    """

    def __init__(self, message: str, *, handler: str, index: int | None = None) -> None:
        super().__init__(message)
        self.handler = handler
        self.index = index


class MaxRoundsExceededError(ThreadlineError):
    """The model asked for more tool rounds than ``with_max_rounds`` allows."""

    def __init__(self, max_rounds: int) -> None:
        super().__init__(
            f"the model was still calling tools after {max_rounds} round(s); "
            "raise the bound with Request.with_max_rounds(n)"
        )
        self.max_rounds = max_rounds


class OutputValidationError(ThreadlineError, ValueError):
    """The model's final answer did not validate as the request's ``output_type``,
    after every repair round (``output_retries``) was spent, or it was refused or
    cut off.

    ``text`` is the raw answer, ``path`` where in it the first problem sits
    (``"$.items[2].price"``; ``"$"`` for the whole answer), ``reason`` what is
    wrong there, and ``attempts`` how many answers were tried. Nothing of the
    failed turn is added to a conversation.
    """

    def __init__(self, reason: str, *, text: str, path: str = "$", attempts: int = 1) -> None:
        super().__init__(
            f"the answer is not a valid value of the output type after {attempts} "
            f"attempt(s): {path}: {reason}"
        )
        self.reason = reason
        self.text = text
        self.path = path
        self.attempts = attempts


class ConversationFormatError(ThreadlineError, ValueError):
    """A saved conversation or message list that cannot be loaded.

    ``path`` locates the problem in the document (``$.messages[3].role``).
    """

    def __init__(self, reason: str, *, path: str = "$") -> None:
        super().__init__(f"{path}: {reason}")
        self.reason = reason
        self.path = path


class ConcurrentModificationError(ThreadlineError):
    """A store write was based on a version that is no longer current.

    Nothing was written; load the conversation again and retry. When the
    refused write was a conversation committing a turn the model had already
    answered, ``unsaved_result`` holds that turn's ``RunResult``, so the
    answer is not lost with the write.
    """

    unsaved_result: Any = None

    def __init__(
        self,
        conversation_id: str,
        *,
        expected: int,
        actual: int | None,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        found = "no conversation" if actual is None else f"version {actual}"
        super().__init__(
            message
            or f"conversation {conversation_id!r} changed under you: "
            + (reason or f"expected version {expected}, store has {found}")
        )
        self.conversation_id = conversation_id
        self.expected = expected
        self.actual = actual


class ConversationNotFoundError(ThreadlineError, KeyError):
    """A store holds no conversation with that id."""

    def __init__(self, conversation_id: str) -> None:
        super().__init__(conversation_id)
        self.conversation_id = conversation_id

    def __str__(self) -> str:
        return f"no conversation with id {self.conversation_id!r}"


class StoreError(ThreadlineError):
    """A store could not do its work: its database is locked past the time-out,
    its server cannot be reached, its file cannot be written. Nothing was
    changed; the operation may be retried."""


class StoreClosedError(StoreError):
    """A store was used after ``aclose()``; open a new store to go on."""


class TokenizerDataError(ThreadlineError):
    """The tokenizer vocabulary shipped with threadline is missing or damaged."""


class ToolArgumentsError(ThreadlineError, ValueError):
    """A tool call's arguments are not the JSON object the tool expects."""


class ToolError(ThreadlineError):
    """A tool could not run: its MCP server could not start, or stopped during a call.

    Raised when a server is entered (``async with MCPServer...``); during a
    run the same error is the cause of an error result the model reads.
    """


class ProviderError(ThreadlineError):
    """The provider could not serve the request.

    ``status`` is the HTTP status (``None`` when no response came back),
    ``body`` the response body as text, ``request_id`` the id the provider gave
    the request, when it gave one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str | None = None,
        request_id: str | None = None,
        provider: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = body
        self.request_id = request_id
        self.provider = provider

    def __str__(self) -> str:
        details = []
        if self.provider:
            details.append(self.provider)
        if self.status is not None:
            details.append(f"status {self.status}")
        if self.request_id:
            details.append(f"request id {self.request_id}")
        return f"{self.message} ({', '.join(details)})" if details else self.message


class AuthenticationError(ProviderError):
    """The provider refused the credentials (401 or 403)."""


class RateLimitError(ProviderError):
    """The provider is rate limiting this client (429), after all retries."""


class BadRequestError(ProviderError):
    """The provider refused the request as malformed or unsupported."""


class ContextLengthExceededError(BadRequestError):
    """The prompt did not fit the model's context window.

    ``prompt_tokens`` and ``context_limit`` are what the provider reported,
    when it said.
    """

    def __init__(
        self,
        message: str,
        *,
        prompt_tokens: int | None = None,
        context_limit: int | None = None,
        status: int | None = None,
        body: str | None = None,
        request_id: str | None = None,
        provider: str | None = None,
    ) -> None:
        super().__init__(
            message, status=status, body=body, request_id=request_id, provider=provider
        )
        self.prompt_tokens = prompt_tokens
        self.context_limit = context_limit


class ProviderUnavailableError(ProviderError):
    """The provider could not be reached or failed on its side (5xx, time-out)."""


class RequestTimeoutError(ProviderUnavailableError):
    """A provider call ran past a time limit of the request.

    ``limit`` names the setting (``"timeout"``: the call as a whole;
    ``"first_token_timeout"``: a stream's wait for the first piece of its
    reply) and ``seconds`` its value. The call is abandoned, its connection
    closed and not retried. Raised by the run loop for every driver; exported
    from :mod:`threadline.drivers`.
    """

    def __init__(self, *, limit: str, seconds: float, provider: str | None = None) -> None:
        if limit == "first_token_timeout":
            what = f"sent nothing of its reply within the first_token_timeout of {seconds:g} s"
        else:
            what = f"did not finish within the timeout of {seconds:g} s"
        super().__init__(f"the provider {what}", provider=provider)
        self.limit = limit
        self.seconds = seconds


class ProviderResponseError(ProviderError):
    """The provider answered with something its protocol does not allow."""
