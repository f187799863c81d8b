"""``Agent``: the reusable setup of requests and conversations.

An agent is a client, a model, instructions, tools and one
:class:`RequestSettings` value. It holds no conversation state:
:meth:`Agent.run` is a one-shot request, and a
:class:`~threadline.Conversation` builds each turn's request from
:meth:`Agent.request`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Unpack

from threadline._errors import InvalidRequestError
from threadline._events import StreamEvent
from threadline._messages import Message
from threadline._models import Model
from threadline._result import RunResult
from threadline._settings import RequestSettings, SettingsChanges
from threadline._validate import fail
from threadline.counting._protocol import TokenCounter
from threadline.engine._client import Client
from threadline.engine._plan import settings_counter
from threadline.engine._request import Request
from threadline.tools._tools import Tool, Toolset, ToolSource

__all__ = ["Agent", "combined_settings"]


def combined_settings(
    base: RequestSettings, settings: RequestSettings | None, changes: SettingsChanges
) -> RequestSettings:
    """``settings`` (else ``base``) with ``changes`` applied: what ``settings=`` plus
    keyword arguments mean for an ``Agent`` and a ``Conversation``."""
    if settings is not None and not isinstance(settings, RequestSettings):
        fail("settings", "a RequestSettings or None", settings)
    return (base if settings is None else settings).evolve(**changes)


class Agent:
    """Reusable setup: a client, a model, instructions, tools and request settings.

    The settings (a :class:`RequestSettings`, or its fields as keyword
    arguments, which change ``settings``) apply to every request the agent
    makes: its one-shot :meth:`run` and :meth:`stream`, and every turn of
    every conversation built on it, loaded ones included. Limiting handlers
    set here reach them all. An agent does not change once built; many
    conversations can share one. ``output_type=T`` makes every answer a
    validated ``T`` in ``RunResult.output`` (docs/structured-output.md).

    ``model`` unset uses the client's ``default_model``. Tools are ``Tool``
    objects or typed functions; every tool needs a function, since the agent
    runs the tools the model calls.

    Raises:
        InvalidRequestError: two tools with one name, a tool without a
            function, or an option of the wrong type.

    Example::

        agent = Agent(client, model=Model("gpt-4o-mini", context_size=128_000),
                      instructions="You are terse.", tools=[get_weather],
                      max_output_tokens=500, pre_max_tokens_reached=my_handler)
        print((await agent.run("Weather in Porto?")).text)
    """

    __slots__ = ("_client", "_instructions", "_model", "_settings", "_sources", "_tools")

    def __init__(
        self,
        client: Client,
        *,
        model: Model | str | None = None,
        instructions: str | None = None,
        tools: Iterable[Tool | ToolSource | Callable[..., Any]] = (),
        settings: RequestSettings | None = None,
        **options: Unpack[SettingsChanges],
    ) -> None:
        if not isinstance(client, Client):
            fail("client", "a Client", client)
        if isinstance(model, str):
            model = Model(model)
        if model is not None and not isinstance(model, Model):
            fail("model", "a Model, a name or None", model)
        if instructions is not None and not isinstance(instructions, str):
            fail("instructions", "a str or None", instructions)
        given = tuple(tools)
        # A source (an MCP server) is asked for its tools when a request is planned.
        sources = tuple(each for each in given if isinstance(each, ToolSource))
        toolset = Toolset(tuple(each for each in given if not isinstance(each, ToolSource)))
        for each in toolset:
            if each.function is None:
                raise InvalidRequestError(
                    f"tool {each.name!r} has no function; an agent runs the tools "
                    "the model calls, so each needs one"
                )
        self._client = client
        self._model = model
        self._instructions = instructions
        self._tools = toolset.tools
        self._sources = sources
        self._settings = combined_settings(RequestSettings(), settings, options)

    @property
    def client(self) -> Client:
        """The client every request is sent through."""
        return self._client

    @property
    def model(self) -> Model | None:
        """The model requests use: the agent's own, else the client's ``default_model``."""
        return self._model or self._client.default_model

    @property
    def instructions(self) -> str | None:
        """The system message sent first on every request."""
        return self._instructions

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The tools the model may call (a tool source's as it offers them now).

        Raises:
            InvalidRequestError: a tool source is not ready (an MCP server
                not entered with ``async with``).
        """
        return Toolset((*self._tools, *self._sources)).tools if self._sources else self._tools

    @property
    def settings(self) -> RequestSettings:
        """The options every request of the agent starts from."""
        return self._settings

    @property
    def token_counter(self) -> TokenCounter | None:
        """The agent's counter: the request tier of the counting chain."""
        return self._settings.token_counter

    @property
    def max_output_tokens(self) -> int | None:
        """The most tokens a reply may have, when set."""
        return self._settings.max_output_tokens

    def resolved_token_counter(self) -> TokenCounter:
        """The counter a request counts with (agent → client → driver → default → built-in).

        Raises:
            InvalidRequestError: neither the agent nor the client names a model.
        """
        model = self.model
        if model is None:
            raise InvalidRequestError(
                "no model: give the Agent a model or the Client a default_model"
            )
        return settings_counter(self._settings, self._client.defaults, model)

    def request(self) -> Request[Any]:
        """A new request with the agent's setup applied, ready for history and a prompt."""
        request = (
            self._client.request()
            .with_settings(self._settings)
            .with_system(self._instructions)
            .with_tools((*self._tools, *self._sources))
        )
        if self._model is not None:
            request.with_model(self._model)
        return request

    async def run(self, prompt: str | Message) -> RunResult[Any]:
        """One request with the agent's setup and no memory: nothing before ``prompt``
        is sent, and nothing is kept for next time (use a ``Conversation`` for that).

        It returns what ``Conversation.run`` returns, through the same budget,
        handlers and counting chain.

        Raises:
            InvalidRequestError: a prompt that is not a str or a user message,
                or no model.
            ProviderError, HandlerError, MaxRoundsExceededError: as ``Request.run``.
        """
        return await self.request().with_prompt(prompt).run()

    def stream(
        self, prompt: str | Message
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        """:meth:`run`, yielding the events of ``Request.stream()``::

        async with agent.stream("Tell me a story.") as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    print(event.text, end="")
        """
        return self.request().with_prompt(prompt).stream()

    def __repr__(self) -> str:
        model = self.model.name if self.model is not None else None
        names: list[object] = [each.name for each in self._tools]
        names += self._sources
        return f"Agent(model={model!r}, tools={names!r})"
