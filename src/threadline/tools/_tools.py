"""Tools the model may call: ``Tool``, the ``@tool`` decorator and ``Toolset``.

A ``Tool`` pairs a name, a description and a JSON schema with the function
that runs when the model calls it. ``@tool`` builds one from a typed
signature and its docstring. ``Tool.invoke`` runs one ``ToolCall`` and always
gives back a ``ToolOutcome``: bad arguments, a failing function or one that
runs past its time limit become an error tool message the model can read and
recover from, never an exception in the run loop. ``Toolset`` holds the tools
of a request and finds the one a call names.
"""

from __future__ import annotations

import abc
import functools
import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

import anyio
import anyio.to_thread
import attrs

from threadline._errors import InvalidRequestError, ToolArgumentsError
from threadline._messages import ToolCall
from threadline._validate import attrs_check, positive_seconds_or_none
from threadline.tools._check import check
from threadline.tools._docstrings import parse_docstring
from threadline.tools._frozen import freeze, thaw
from threadline.tools._results import (
    ToolOutcome,
    ToolResult,
    describe_exception,
    reported_error_outcome,
    result_message,
    timed_out_outcome,
    unknown_tool_outcome,
)
from threadline.tools._signature import Binder, call_method, docstring, signature_parameters

__all__ = [
    "Tool",
    "ToolOutcome",
    "ToolResult",
    "ToolSource",
    "Toolset",
    "invoke_concurrently",
    "tool",
    "unknown_tool_outcome",
]

logger = logging.getLogger("threadline.tools")

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _to_parameters(value: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidRequestError(
            f"a tool's parameters must be a JSON schema mapping, not {type(value).__name__}"
        )
    if value.get("type") != "object":
        raise InvalidRequestError(
            'a tool\'s parameters must be an object schema ({"type": "object", ...}); '
            "providers pass tool arguments as one JSON object"
        )
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"a tool's parameters must be plain JSON: {exc}") from None
    return freeze(value)  # type: ignore[no-any-return]


def _check_name(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidRequestError(
            f"tool name {value!r} is not allowed: providers accept 1 to 64 characters, "
            "each a letter, a digit, '_' or '-' (pass name=... to @tool to choose another)"
        )


def _check_result_cap(instance: Any, attribute: Any, value: Any) -> None:
    if value is None or value == "budget":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequestError(
            f"max_result_tokens must be a positive int, 'budget' or None, not {value!r}"
        )


def _empty_parameters() -> Mapping[str, Any]:
    return {"type": "object", "properties": {}}


def _is_async(function: Callable[..., Any]) -> bool:
    # A callable object with ``async def __call__`` is async too.
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        call_method(function)
    )


# ---------------------------------------------------------------------------
# Tool


@attrs.frozen(kw_only=True, eq=False)
class Tool:
    """A function the model may call.

    ``parameters`` is the JSON schema (an object schema) of its arguments,
    read-only (``json_schema()`` gives a mutable copy); ``function`` (sync or
    async) is called with the decoded arguments as keyword arguments. A tool
    without a function is declared to the model but executed by the caller.

    A sync function runs in a worker thread (``anyio.to_thread.run_sync``) so
    a blocking call does not stall other tools and the event loop; pass
    ``in_thread=False`` for a quick pure function. Build tools with
    :func:`tool`, or directly for a hand-written schema.

    ``timeout`` is the most seconds one call may take; past it the call is an
    error outcome the model reads, and the run goes on. Unset, the request's
    ``tool_timeout`` applies (none by default). An async function is
    cancelled at its limit; a sync function's worker thread cannot be
    stopped, so it is abandoned and runs on to its end in the background.

    ``max_result_tokens`` caps a result: a longer one is cut once, when it
    enters the transcript, with a marker saying how much was left out.
    ``"budget"`` sizes the cap to the run (a quarter of its prompt budget);
    ``None`` (the default of ``@tool``) keeps every result whole.

    Raises:
        InvalidRequestError: a name providers refuse (they accept
            ``^[a-zA-Z0-9_-]{1,64}$``), parameters that are not a JSON
            object schema, or a ``timeout`` that is not a positive number.
    """

    name: str = attrs.field(validator=_check_name)
    description: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    parameters: Mapping[str, Any] = attrs.field(factory=_empty_parameters, converter=_to_parameters)
    function: Callable[..., Any] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )
    in_thread: bool = True
    timeout: float | None = attrs.field(
        default=None, validator=attrs_check(positive_seconds_or_none)
    )
    max_result_tokens: int | Literal["budget"] | None = attrs.field(
        default=None, validator=_check_result_cap
    )
    _binder: Binder | None = attrs.field(default=None, alias="_binder", repr=False)

    @classmethod
    def from_function(
        cls,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        in_thread: bool = True,
        timeout: float | None = None,
    ) -> Tool:
        """Build a tool from a typed function; :func:`tool` as a plain call.

        Raises:
            InvalidRequestError: a parameter without a type, of a type with no
                JSON schema, ``*args``/``**kwargs``, or an unusable name.
        """
        if not callable(function):
            raise InvalidRequestError(f"a tool needs a function, not {type(function).__name__}")
        qualname = getattr(function, "__qualname__", None) or repr(function)
        if name is None:
            name = getattr(function, "__name__", None)
            if name is None:
                raise InvalidRequestError(f"{qualname} has no __name__; pass name=... to @tool")
        parameters, binder = signature_parameters(function, qualname)
        if description is None:
            description, _ = parse_docstring(docstring(function))
        return cls(
            name=name,
            description=description,
            parameters=parameters,
            function=function,
            in_thread=in_thread,
            timeout=timeout,
            _binder=binder,
        )

    def json_schema(self) -> dict[str, Any]:
        """A mutable deep copy of ``parameters``."""
        return thaw(self.parameters)  # type: ignore[no-any-return]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function directly, as if it were not a tool.

        Raises:
            InvalidRequestError: the tool has no function.
        """
        return self._require_function()(*args, **kwargs)

    async def invoke(self, call: ToolCall, *, default_timeout: float | None = None) -> ToolOutcome:
        """Run ``call`` and return its outcome.

        Arguments that are not JSON or do not fit the schema, exceptions from
        the function and a call past its time limit (the tool's ``timeout``,
        else ``default_timeout``) give an error outcome whose text tells the
        model what went wrong; they are never raised. Cancellation propagates
        at once, abandoning a sync function's worker thread.

        Raises:
            InvalidRequestError: the tool has no function (the caller runs it).
        """
        function = self._require_function()
        try:
            arguments = call.parsed()
        except ToolArgumentsError as exc:
            return self._failure(call, f"{exc}; send the arguments as one JSON object", exc)
        timeout = self.timeout if self.timeout is not None else default_timeout
        try:
            problems = check(arguments, self.parameters)
            if problems:
                reason = "; ".join(problems)
                return self._failure(call, reason, ToolArgumentsError(reason))
            args, kwargs = self._binder.bind(arguments) if self._binder else ([], arguments)
            with anyio.move_on_after(timeout) as limit:
                value = await self._run(function, args, kwargs)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            logger.info("tool %r raised on call %r", self.name, call.id, exc_info=True)
            return self._failure(call, f"the tool raised {describe_exception(exc)}", exc)
        if limit.cancelled_caught:
            assert timeout is not None
            logger.info(
                "tool %r ran past its %g s time limit on call %r", self.name, timeout, call.id
            )
            return timed_out_outcome(call, self.name, timeout)
        return self._outcome(call, value)

    def _outcome(self, call: ToolCall, value: Any) -> ToolOutcome:
        content, injected = (
            (value.content, value.inject) if isinstance(value, ToolResult) else (value, ())
        )
        try:
            message = result_message(call, self.name, content)
        except Exception as exc:
            # json's own refusals say enough; anything else also says what it was.
            plain = isinstance(exc, TypeError | ValueError)
            detail = describe_exception(exc, kind=not plain)
            reason = f"the tool's result could not be turned into text: {detail}"
            return self._failure(call, reason, exc)
        if isinstance(value, ToolResult) and value.is_error:
            return reported_error_outcome(call, self.name, message.text)
        return ToolOutcome(call=call, message=message, injected=injected)

    async def _run(
        self, function: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        if _is_async(function):
            result = await function(*args, **kwargs)
        elif self.in_thread:
            # Abandoned on cancel: a thread cannot be stopped, but its caller need not wait.
            result = await anyio.to_thread.run_sync(
                functools.partial(function, *args, **kwargs), abandon_on_cancel=True
            )
        else:
            result = function(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    def _failure(self, call: ToolCall, reason: str, exception: BaseException) -> ToolOutcome:
        return ToolOutcome.failure(call, reason, exception, name=self.name)

    def _require_function(self) -> Callable[..., Any]:
        if self.function is None:
            raise InvalidRequestError(
                f"tool {self.name!r} has no function: it is declared to the model and "
                "its calls are for the caller to run"
            )
        return self.function


@overload
def tool(
    function: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    in_thread: bool = True,
    timeout: float | None = None,
) -> Tool: ...


@overload
def tool(
    function: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    in_thread: bool = True,
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    in_thread: bool = True,
    timeout: float | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a :class:`Tool`, bare (``@tool``) or with options.

    The parameters' types give the JSON schema: ``str``, ``int``, ``float``,
    ``bool``, ``list[X]``, ``tuple[X, ...]``, ``dict[str, X]``, ``Literal``,
    ``Enum``, attrs classes, ``X | None`` and ``Any``; a default makes a
    parameter optional. The docstring gives the description (its text before
    the first section) and each argument's description (Google ``Args:``,
    reST ``:param x:`` or NumPy ``Parameters``). The function stays callable
    through the tool. ``timeout`` bounds each call in seconds (see
    :class:`Tool`).

    Example::

        @tool
        async def get_weather(city: str, unit: Literal["c", "f"] = "c") -> str:
            \"\"\"The current weather in a city.

            Args:
                city: The city's name, like "Lisbon".
                unit: Celsius or Fahrenheit.
            \"\"\"

    Raises:
        InvalidRequestError: see :meth:`Tool.from_function`.
    """

    def decorate(function: Callable[..., Any]) -> Tool:
        if isinstance(function, Tool):
            changes: dict[str, Any] = {"in_thread": in_thread}
            if name is not None:
                changes["name"] = name
            if description is not None:
                changes["description"] = description
            if timeout is not None:
                changes["timeout"] = timeout
            return attrs.evolve(function, **changes)
        return Tool.from_function(
            function, name=name, description=description, in_thread=in_thread, timeout=timeout
        )

    return decorate if function is None else decorate(function)


# ---------------------------------------------------------------------------
# Toolset


class ToolSource(abc.ABC):
    """Something that offers tools it learns at run time (an MCP server), passed in
    ``tools=`` beside ``Tool`` values; its tools are read each time a request is planned."""

    @property
    @abc.abstractmethod
    def source_name(self) -> str:
        """A short name, put in front of a tool's name (``NAME_tool``) when two collide."""

    @property
    @abc.abstractmethod
    def prefix(self) -> str | None:
        """``None``: prefix a tool's name only when it collides; a string: always
        put it in front; ``""``: never (a collision is then an error)."""

    @abc.abstractmethod
    def current_tools(self) -> tuple[Tool, ...]:
        """The tools offered now.

        Raises:
            InvalidRequestError: the source is not ready (not connected).
        """


def _to_tools(values: Iterable[Tool | ToolSource | Callable[..., Any]]) -> tuple[Tool, ...]:
    plain: list[Tool] = []
    sources: list[ToolSource] = []
    for value in values:
        if isinstance(value, ToolSource):
            sources.append(value)
        else:
            plain.append(value if isinstance(value, Tool) else tool(value))
    tools = tuple(plain) + _source_tools(sources, plain)
    seen: set[str] = set()
    for each in tools:
        if each.name in seen:
            raise InvalidRequestError(
                f"tool name {each.name!r} appears twice; names must be unique"
            )
        seen.add(each.name)
    return tools


def _source_tools(sources: Sequence[ToolSource], plain: Sequence[Tool]) -> tuple[Tool, ...]:
    """The sources' tools, each named with its source's prefix when it has one, or when
    its name collides with another tool's and the source prefixes on collision."""
    offered = [(source, source.current_tools()) for source in sources]
    counts: dict[str, int] = {}
    for name in [t.name for t in plain] + [t.name for _, ts in offered for t in ts]:
        counts[name] = counts.get(name, 0) + 1
    named: list[Tool] = []
    for source, tools in offered:
        prefix = source.prefix
        for each in tools:
            clash = counts[each.name] > 1
            if prefix or (prefix is None and clash):
                each = attrs.evolve(each, name=_prefixed(prefix or source.source_name, each.name))
            named.append(each)
    return tuple(named)


def _prefixed(prefix: str, name: str) -> str:
    joined = f"{prefix}_{name}"
    # Providers take at most 64 characters: the prefix gives way, never the tool's name.
    return joined if len(joined) <= 64 else f"{prefix[: max(1, 63 - len(name))]}_{name}"[-64:]


@attrs.frozen(eq=False)
class Toolset:
    """The tools of a request, by name.

    Plain functions are made tools with :func:`tool`; a :class:`ToolSource`
    (an MCP server) gives its tools as it offers them now, each named with
    its source's prefix when it has one or when its name collides.

    Raises:
        InvalidRequestError: two tools with one name, or a function that
            cannot be a tool.
    """

    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_to_tools)
    _by_name: Mapping[str, Tool] = attrs.field(init=False, repr=False)

    @_by_name.default
    def _index(self) -> Mapping[str, Tool]:
        return {each.name: each for each in self.tools}

    @property
    def names(self) -> tuple[str, ...]:
        """The tools' names, in order."""
        return tuple(self._by_name)

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None``."""
        return self._by_name.get(name)

    def __getitem__(self, name: str) -> Tool:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)

    async def invoke(self, call: ToolCall, *, default_timeout: float | None = None) -> ToolOutcome:
        """Run ``call`` with the tool it names; an unknown name is an error outcome.

        ``default_timeout`` is the time limit of a tool without its own.

        Raises:
            InvalidRequestError: the named tool has no function.
        """
        found = self._by_name.get(call.name)
        if found is None:
            return unknown_tool_outcome(call, self.names)
        return await found.invoke(call, default_timeout=default_timeout)

    async def invoke_all(
        self, calls: Sequence[ToolCall], *, default_timeout: float | None = None
    ) -> list[ToolOutcome]:
        """Run ``calls`` concurrently; the outcomes come back in the calls' order.

        ``default_timeout`` is the time limit of a tool without its own.

        Raises:
            InvalidRequestError: a named tool has no function (checked before
                anything runs).
        """
        for call in calls:
            found = self._by_name.get(call.name)
            if found is not None:
                found._require_function()
        return await invoke_concurrently(
            calls, functools.partial(self.invoke, default_timeout=default_timeout)
        )


async def invoke_concurrently(
    calls: Sequence[ToolCall], invoke: Callable[[ToolCall], Awaitable[ToolOutcome]]
) -> list[ToolOutcome]:
    """``invoke`` each call in a task of its own; the outcomes in the calls' order.

    ``invoke`` turns every failure into an outcome (``Tool.invoke`` does), so
    what escapes is an interrupt (Ctrl-C on trio, ``SystemExit``): it is
    raised as itself, not in an exception group, so ``except
    KeyboardInterrupt`` sees it.
    """
    outcomes: list[ToolOutcome | None] = [None] * len(calls)

    async def run(index: int, call: ToolCall) -> None:
        outcomes[index] = await invoke(call)

    try:
        async with anyio.create_task_group() as group:
            for index, call in enumerate(calls):
                group.start_soon(run, index, call)
    except BaseExceptionGroup as caught:
        interrupt = _interrupt_in(caught)
        if interrupt is None:
            raise
        raise interrupt from None
    return [outcome for outcome in outcomes if outcome is not None]


def _interrupt_in(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    for each in group.exceptions:
        found = _interrupt_in(each) if isinstance(each, BaseExceptionGroup) else each
        if isinstance(found, KeyboardInterrupt | SystemExit):
            return found
    return None
