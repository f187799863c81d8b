"""``server_state=True``: ``previous_response_id`` when, and only when, the history is
exactly what the server holds; the whole stateless transcript otherwise."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from threadline import BadRequestError, Client, Message, Model, tool
from threadline.drivers import OpenAIResponsesDriver, ProviderCall, ResponseDone, RetryPolicy

pytestmark = pytest.mark.anyio

BASE = "https://responses.example/v1"
URL = f"{BASE}/responses"
MODEL = Model("gpt-test", context_size=100_000)
NO_WAIT = RetryPolicy(max_retries=0)
LOGGER = "threadline.drivers.openai_responses"


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def answer(number: int, *output: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"resp_{number}",
        "object": "response",
        "status": "completed",
        "model": "gpt-test",
        "output": list(output),
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def text(words: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": words}]
    return {"id": "msg_1", "type": "message", "role": "assistant", "content": content}


REASONING = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "gAAAB=="}
CALL = {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "lookup"}


class Server:
    """Answers in turn, and keeps every body it was sent."""

    def __init__(self, *outputs: list[dict[str, Any]]) -> None:
        self.outputs = list(outputs)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        output = self.outputs[min(len(self.bodies), len(self.outputs)) - 1]
        return httpx.Response(200, json=answer(len(self.bodies), *output))


def driver(http: httpx.AsyncClient, **kwargs: Any) -> OpenAIResponsesDriver:
    return OpenAIResponsesDriver(BASE, http_client=http, retry_policy=NO_WAIT, **kwargs)


def kinds(body: dict[str, Any]) -> list[str]:
    return [item.get("type", "") for item in body["input"]]


async def test_a_tool_round_continues_the_stored_response_with_its_new_items() -> None:
    server = Server([REASONING, {**CALL, "arguments": '{"city": "Oslo"}'}], [text("Sunny.")])
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
        client = Client(driver(http, server_state=True), default_model=MODEL)
        result = await client.request().with_prompt("Oslo?").with_tools([lookup]).run()
    first, second = server.bodies
    assert first["store"] is True
    assert "previous_response_id" not in first
    assert second["store"] is True
    assert second["previous_response_id"] == "resp_1"
    assert kinds(second) == ["function_call_output"]
    assert result.text == "Sunny."


async def test_without_the_option_nothing_is_stored_nor_continued() -> None:
    server = Server([REASONING, {**CALL, "arguments": "{}"}], [text("Sunny.")])
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
        client = Client(driver(http), default_model=MODEL)
        await client.request().with_prompt("Oslo?").with_tools([lookup]).run()
    assert all(body["store"] is False for body in server.bodies)
    assert all("previous_response_id" not in body for body in server.bodies)
    assert kinds(server.bodies[1]) == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]


async def test_a_stream_continues_too() -> None:
    events = [
        {"type": "response.created", "response": {"id": "resp_s", "model": "gpt-test"}},
        {"type": "response.output_item.added", "output_index": 0, "item": text("")},
        {"type": "response.output_text.delta", "output_index": 0, "delta": "Hi"},
        {"type": "response.completed", "response": {"id": "resp_s", "status": "completed"}},
    ]
    sse = "".join(f"data: {json.dumps(event)}\n\n" for event in events)
    with respx.mock() as mock:
        route = mock.post(URL).respond(200, text=sse, headers={"content-type": "text/event-stream"})
        async with httpx.AsyncClient() as http:
            d = driver(http, server_state=True)
            first = (Message.user("hi"),)
            async with d.stream(ProviderCall(model=MODEL, messages=first)) as chunks:
                replies = [chunk async for chunk in chunks]
            reply = replies[-1].response.message  # type: ignore[union-attr]
            then = (*first, reply, Message.user("again"))
            async with d.stream(ProviderCall(model=MODEL, messages=then)) as chunks:
                [chunk async for chunk in chunks]
            other = (Message.user("elsewhere"), reply, Message.user("again"))
            async with d.stream(ProviderCall(model=MODEL, messages=other)) as chunks:
                done = [chunk async for chunk in chunks][-1]
    assert isinstance(done, ResponseDone)
    assert "not what was sent with it" in done.response.replay_notes[0]
    body = json.loads(route.calls[1].request.content)
    assert body["previous_response_id"] == "resp_s"
    assert body["input"] == [{"type": "message", "role": "user", "content": "again"}]


@pytest.mark.parametrize("change", ["cut", "edited", "replaced"])
async def test_a_history_that_is_not_what_the_server_holds_is_sent_whole(
    change: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = Server([text("one")], [text("two")], [text("three")])
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
        d = driver(http, server_state=True)
        history: tuple[Message, ...] = (Message.user("q1"),)
        reply = await d.complete(ProviderCall(model=MODEL, messages=history))
        history = (*history, reply.message, Message.user("q2"))
        reply = await d.complete(ProviderCall(model=MODEL, messages=history))
        history = (*history, reply.message)
        if change == "cut":  # limiting dropped the first turn
            history = history[2:]
        elif change == "edited":  # a handler rewrote an old message
            history = (Message.user("q1, shortened"), *history[1:])
        else:  # a history the driver never saw, ending with a reply it made
            history = (Message.user("something else"), history[-1])
        assert reply.replay_notes == ()  # it continued: nothing to say
        with caplog.at_level("INFO", logger=LOGGER):
            whole = await d.complete(
                ProviderCall(model=MODEL, messages=(*history, Message.user("q3")))
            )
    (note,) = whole.replay_notes  # the round's record says why, not only the log
    assert note.startswith("sent whole, without previous_response_id")
    assert "resp_2" in note
    assert server.bodies[1]["previous_response_id"] == "resp_1"  # the unchanged round did
    last = server.bodies[2]
    assert "previous_response_id" not in last
    assert last["store"] is True
    assert [item["content"] for item in last["input"]][-1] == "q3"
    assert len(last["input"]) == len(history) + 1  # the whole transcript
    assert "sent whole, without previous_response_id" in caplog.text
    assert "resp_2" in caplog.text  # the reply it knew, and why it could not continue


async def test_a_restored_history_is_sent_whole_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Server([text("ok")])
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
        d = driver(http, server_state=True)
        history = (Message.user("q1"), Message.assistant("from yesterday"), Message.user("q2"))
        with caplog.at_level("INFO", logger=LOGGER):
            await d.complete(ProviderCall(model=MODEL, messages=history))
    assert "previous_response_id" not in server.bodies[0]
    assert "no stored response of this driver is known" in caplog.text


async def test_a_response_the_server_dropped_is_forgotten_and_the_call_sent_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gone = {
        "error": {
            "message": "Previous response with id 'resp_1' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
        }
    }
    with respx.mock() as mock:
        route = mock.post(URL).mock(
            side_effect=[
                httpx.Response(200, json=answer(1, text("one"))),
                httpx.Response(400, json=gone),
                httpx.Response(200, json=answer(3, text("three"))),
                httpx.Response(200, json=answer(4, text("four"))),
            ]
        )
        async with httpx.AsyncClient() as http:
            d = driver(http, server_state=True)
            history: tuple[Message, ...] = (Message.user("q1"),)
            reply = await d.complete(ProviderCall(model=MODEL, messages=history))
            history = (*history, reply.message, Message.user("q2"))
            with caplog.at_level("INFO", logger=LOGGER):
                reply = await d.complete(ProviderCall(model=MODEL, messages=history))
            assert reply.text == "three"
            assert reply.replay_notes == (
                "sent whole, without previous_response_id: the server no longer has resp_1",
            )
            history = (*history, reply.message, Message.user("q3"))
            await d.complete(ProviderCall(model=MODEL, messages=history))
    bodies = [json.loads(call.request.content) for call in route.calls]
    assert bodies[1]["previous_response_id"] == "resp_1"
    assert "previous_response_id" not in bodies[2]
    assert len(bodies[2]["input"]) == 3
    assert bodies[3]["previous_response_id"] == "resp_3"  # the chain goes on from there
    assert "no longer has resp_1" in caplog.text


async def test_other_refusals_are_not_retried() -> None:
    refusal = {"error": {"message": "Invalid 'input'.", "type": "invalid_request_error"}}
    with respx.mock() as mock:
        route = mock.post(URL).mock(
            side_effect=[
                httpx.Response(200, json=answer(1, text("one"))),
                httpx.Response(400, json=refusal),
            ]
        )
        async with httpx.AsyncClient() as http:
            d = driver(http, server_state=True)
            history: tuple[Message, ...] = (Message.user("q1"),)
            reply = await d.complete(ProviderCall(model=MODEL, messages=history))
            with pytest.raises(BadRequestError, match="Invalid 'input'"):
                await d.complete(
                    ProviderCall(model=MODEL, messages=(*history, reply.message, Message.user("x")))
                )
    assert len(route.calls) == 2


def test_server_state_must_be_a_bool() -> None:
    with pytest.raises(Exception, match="server_state"):
        OpenAIResponsesDriver(BASE, server_state="yes")  # type: ignore[arg-type]


async def test_a_server_that_refuses_previous_response_id_says_what_to_do() -> None:
    refusal = {"error": {"message": "llama.cpp does not support 'previous_response_id'."}}
    with respx.mock() as mock:
        mock.post(URL).mock(
            side_effect=[
                httpx.Response(200, json=answer(1, text("one"))),
                httpx.Response(400, json=refusal),
            ]
        )
        async with httpx.AsyncClient() as http:
            d = driver(http, server_state=True)
            history: tuple[Message, ...] = (Message.user("q1"),)
            reply = await d.complete(ProviderCall(model=MODEL, messages=history))
            then = (*history, reply.message, Message.user("x"))
            with pytest.raises(BadRequestError, match="server_state=False") as refused:
                await d.complete(ProviderCall(model=MODEL, messages=then))
    assert refused.value.status == 400
    assert refused.value.__context__ is None  # raised past the except block
