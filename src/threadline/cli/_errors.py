"""How the command reports failures: one line each, naming the file, URL or flag."""

from __future__ import annotations

import json
import re

from threadline import (
    AuthenticationError,
    ContextLengthExceededError,
    ConversationFormatError,
    ConversationNotFoundError,
    ProviderError,
    ProviderResponseError,
    ProviderUnavailableError,
    ThreadlineError,
)

__all__ = ["USER_FACING_ERRORS", "CliError", "describe"]


class CliError(Exception):
    """A failure the command reports as one line on stderr."""


USER_FACING_ERRORS = (CliError, ThreadlineError, OSError, ValueError)
"""What ends as one line on stderr, never a traceback."""

# The HTTP layer says "could not reach the provider (ConnectError: detail)".
_TRANSPORT = re.compile(r"\((?P<kind>\w+(?:Error|Timeout|Exception)): (?P<detail>.*)\)\s*$")


def _provider_error(error: ProviderError, url: str | None) -> str:
    where = url or "the provider"
    if isinstance(error, AuthenticationError):
        return f"{where} refused the API key ($OPENAI_API_KEY): {error.message}"
    if isinstance(error, ContextLengthExceededError):
        limit = f" of {error.context_limit} tokens" if error.context_limit else ""
        return (
            f"the prompt does not fit the model's window{limit} at {where}: "
            "set --max-context-tokens to the server's window (or shorten the prompt)"
        )
    if isinstance(error, ProviderUnavailableError) and error.status is None:
        found = _TRANSPORT.search(error.message)
        detail = f"{found['kind']}: {found['detail']}" if found else error.message
        hint = "; is the server running?" if url and "timed out" not in error.message else ""
        return f"cannot reach {where} ({detail}){hint}"
    if isinstance(error, ProviderResponseError) and "stream ended" in error.message:
        return (
            f"{where} ended the answer without a word; if the prompt is long for the "
            "server's window, set --max-context-tokens to it"
        )
    return f"{where}: {error}"


def describe(error: BaseException, *, url: str | None = None) -> str:
    """One line for an error a user meets; ``url`` names the provider being talked to."""
    if isinstance(error, ProviderError):
        return _provider_error(error, url)
    if isinstance(error, ConversationFormatError):
        # A path is only worth showing inside a document, not for its root.
        if error.path in ("", "$"):
            return error.reason
        return f"{error.reason} (at {error.path})"
    if isinstance(error, ConversationNotFoundError):
        return str(error)
    if isinstance(error, FileNotFoundError):
        return f"no such file: {error.filename}"
    if isinstance(error, IsADirectoryError):
        return f"{error.filename} is a directory, not a file"
    if isinstance(error, PermissionError):
        return f"permission denied: {error.filename}"
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON: {error}"
    if isinstance(error, UnicodeDecodeError):
        return "the file is not UTF-8 text"
    return str(error) or type(error).__name__
