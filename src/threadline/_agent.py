"""``Agent``: the reusable setup of conversations (client, model, instructions, tools).

An agent holds no conversation state; :class:`~threadline._conversation.Conversation`
builds each turn's request from :meth:`Agent.request`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from threadline._client import Client
from threadline._errors import InvalidRequestError
from threadline._models import Model
from threadline._request import DEFAULT_MAX_ROUNDS, Request
from threadline.counting import resolve_token_counter
from threadline.counting._protocol import TokenCounter, is_token_counter
from threadline.limiting._budget import is_int
from threadline.tools._tools import Tool, Toolset

__all__ = ["Agent"]

_SAMPLING = ("temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty")


# -- Agent ------------------------------------------------------------------------------


class Agent:
    """Reusable setup for conversations: a client, a model, instructions, tools.

    Request defaults (``max_output_tokens``, ``temperature``, ``top_p``,
    ``seed``, ``stop``, ``presence_penalty``, ``frequency_penalty``,
    ``tool_choice``, ``max_rounds``, ``token_counter``, ``extra_body``) apply
    to every turn of every conversation built on the agent. An agent does not
    change once built; many conversations can share one.

    ``model`` unset uses the client's ``default_model``. Tools are ``Tool``
    objects or typed functions; every tool needs a function, since a
    conversation runs the tools the model calls.

    Raises:
        InvalidRequestError: two tools with one name, a tool without a
            function, or an option of the wrong type.

    Example::

        agent = Agent(client, model=Model("gpt-4o-mini", context_size=128_000),
                      instructions="You are terse.", tools=[get_weather])
    """

    __slots__ = ("_client", "_counter", "_instructions", "_model", "_options", "_tools")

    def __init__(
        self,
        client: Client,
        *,
        model: Model | str | None = None,
        instructions: str | None = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        tool_choice: str | None = None,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        token_counter: TokenCounter | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(client, Client):
            raise InvalidRequestError(f"Agent needs a Client, not {type(client).__name__}")
        if isinstance(model, str):
            model = Model(model)
        if model is not None and not isinstance(model, Model):
            raise InvalidRequestError(f"model must be a Model or a name, not {model!r}")
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidRequestError("instructions must be a str or None")
        toolset = Toolset(tuple(tools))
        for each in toolset:
            if each.function is None:
                raise InvalidRequestError(
                    f"tool {each.name!r} has no function; a conversation runs the tools "
                    "the model calls, so each needs one"
                )
        if max_output_tokens is not None and (
            not is_int(max_output_tokens) or max_output_tokens <= 0
        ):
            raise InvalidRequestError(
                f"max_output_tokens must be a positive int, not {max_output_tokens!r}"
            )
        if not is_int(max_rounds) or max_rounds < 1:
            raise InvalidRequestError(f"max_rounds must be an int of 1 or more, not {max_rounds!r}")
        if token_counter is not None and not is_token_counter(token_counter):
            raise InvalidRequestError(
                f"token_counter must be a TokenCounter, not {type(token_counter).__name__}"
            )
        self._client = client
        self._model = model
        self._instructions = instructions
        self._tools = toolset.tools
        self._counter = token_counter
        self._options: dict[str, Any] = {
            "max_output_tokens": max_output_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "stop": None if stop is None else tuple(stop),
            "presence_penalty": presence_penalty,
            "frequency_penalty": frequency_penalty,
            "tool_choice": tool_choice,
            "max_rounds": max_rounds,
            "extra_body": None if extra_body is None else dict(extra_body),
        }

    @property
    def client(self) -> Client:
        """The client every turn is sent through."""
        return self._client

    @property
    def model(self) -> Model | None:
        """The model turns use: the agent's own, else the client's ``default_model``."""
        return self._model or self._client.default_model

    @property
    def instructions(self) -> str | None:
        """The system message sent first on every turn."""
        return self._instructions

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The tools the model may call."""
        return self._tools

    @property
    def token_counter(self) -> TokenCounter | None:
        """The agent's counter: the request tier of the counting chain."""
        return self._counter

    @property
    def max_output_tokens(self) -> int | None:
        """The most tokens a reply may have, when set."""
        value: int | None = self._options["max_output_tokens"]
        return value

    def resolved_token_counter(self) -> TokenCounter:
        """The counter a turn counts with (agent → client → driver → default → built-in).

        Raises:
            InvalidRequestError: neither the agent nor the client names a model.
        """
        client = self._client
        return resolve_token_counter(
            self._counter, client.token_counter, client.driver, self._require_model()
        )

    def _require_model(self) -> Model:
        model = self.model
        if model is None:
            raise InvalidRequestError(
                "no model: give the Agent a model or the Client a default_model"
            )
        return model

    def request(self) -> Request:
        """A new request with the agent's setup applied, ready for history and a prompt."""
        options = self._options
        request = self._client.request().with_system(self._instructions).with_tools(self._tools)
        if self._model is not None:
            request.with_model(self._model)
        if options["max_output_tokens"] is not None:
            request.with_max_output_tokens(options["max_output_tokens"])
        if options["tool_choice"] is not None:
            request.with_tool_choice(options["tool_choice"])
        for name in _SAMPLING:
            if options[name] is not None:
                getattr(request, f"with_{name}")(options[name])
        if options["extra_body"] is not None:
            request.with_extra_body(options["extra_body"])
        if self._counter is not None:
            request.with_token_counter(self._counter)
        return request.with_max_rounds(options["max_rounds"])

    def __repr__(self) -> str:
        model = self.model.name if self.model is not None else None
        names = [each.name for each in self._tools]
        return f"Agent(model={model!r}, tools={names!r})"
