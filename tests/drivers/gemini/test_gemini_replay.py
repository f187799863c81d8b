"""Thought signatures go back on exactly the part they came with, and the transcript goes
in the order Gemini demands, repaired or refused before any HTTP call."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import pytest
import respx
from gemini_wire import BASE, KEY, LABEL, MODEL, URL, fixture, sent_body

from threadline import Client, InvalidRequestError, Message, Origin, Reasoning, ToolCall, tool
from threadline.drivers import ProviderCall
from threadline.drivers.gemini import DUMMY_SIGNATURE, GeminiDriver
from threadline.drivers.gemini._request import encode_request

pytestmark = pytest.mark.anyio

SEQUENTIAL = fixture("sequential_calls")["steps"]


@tool
def check_flight(flight: str) -> str:
    """A flight's status.

    Args:
        flight: the flight number.
    """
    return "delayed"


@tool
def book_taxi(time: str) -> str:
    """Book a taxi.

    Args:
        time: when.
    """
    return "booked"


@tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    return "sunny"


def replying(answers: list[dict[str, Any]], sent: list[Any]) -> Callable[[httpx.Request], Any]:
    queue = list(answers)

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(sent_body(request))
        return httpx.Response(200, json=queue.pop(0))

    return answer


def parts_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = answer["candidates"][0]["content"]["parts"]
    return parts


def encoded(*messages: Message) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    request = encode_request(ProviderCall(model=MODEL, messages=messages), label=LABEL)
    contents: list[dict[str, Any]] = json.loads(request.body)["contents"]
    return contents, request.notes


def signed_turn(answer: dict[str, Any], label: str = LABEL) -> Message:
    """The assistant message GeminiDriver made of ``answer``, made here by the driver."""
    from threadline.drivers.gemini._response import parse_response

    return parse_response(answer, requested_model="m", provider=label, request_id=None).message


# --- a real run, step by step --------------------------------------------------


async def test_sequential_calls_send_each_signature_back_on_its_own_call(
    respx_mock: respx.MockRouter,
) -> None:
    sent: list[Any] = []
    respx_mock.post(URL).mock(side_effect=replying(SEQUENTIAL, sent))
    async with GeminiDriver(base_url=BASE, api_key=KEY) as gemini:
        client = Client(gemini, default_model=MODEL)
        request = client.request().with_tools([check_flight, book_taxi])
        result = await request.with_prompt("Is AA100 on time? Book a taxi if not.").run()
    assert result.text.startswith("Your flight AA100 is delayed")
    third = sent[2]["contents"]
    assert [turn["role"] for turn in third] == ["user", "model", "user", "model", "user"]
    # Each step's parts exactly as received, signature included, and nothing added.
    assert third[1]["parts"] == parts_of(SEQUENTIAL[0])
    assert third[3]["parts"] == parts_of(SEQUENTIAL[1])
    # Answered by name; the call came with no id, so the answer names none.
    assert third[2]["parts"] == [
        {"functionResponse": {"name": "check_flight", "response": {"result": "delayed"}}}
    ]
    assert DUMMY_SIGNATURE not in json.dumps(sent)


async def test_parallel_calls_keep_the_one_signature_on_the_first_and_are_answered_together(
    respx_mock: respx.MockRouter,
) -> None:
    sent: list[Any] = []
    answers = [fixture("parallel_calls"), fixture("plain")]
    respx_mock.post(URL).mock(side_effect=replying(answers, sent))
    async with GeminiDriver(base_url=BASE, api_key=KEY) as gemini:
        client = Client(gemini, default_model=MODEL)
        result = (
            await client.request().with_tools([get_weather]).with_prompt("Paris, London?").run()
        )
    model, answer = sent[1]["contents"][1:]
    assert model["parts"] == parts_of(answers[0])
    assert "thoughtSignature" not in model["parts"][1]
    assert [p["functionResponse"]["name"] for p in answer["parts"]] == ["get_weather"] * 2
    assert len(sent[1]["contents"]) == 3
    # The next turn replays the finished turn's parts as received too.
    assert result.messages[1].reasoning is not None


async def test_a_later_turn_replays_the_signed_text_part_as_received(
    respx_mock: respx.MockRouter,
) -> None:
    sent: list[Any] = []
    respx_mock.post(URL).mock(side_effect=replying([fixture("thinking"), fixture("plain")], sent))
    async with GeminiDriver(base_url=BASE, api_key=KEY) as gemini:
        client = Client(gemini, default_model=MODEL)
        first = await client.request().with_prompt("prime above 10?").run()
        await client.request().with_messages(first.messages).with_prompt("and above 20?").run()
    assert sent[1]["contents"][1]["parts"] == parts_of(fixture("thinking"))


async def test_another_models_signature_is_never_sent_and_the_run_records_it(
    respx_mock: respx.MockRouter,
) -> None:
    sent: list[Any] = []
    respx_mock.post(URL).mock(side_effect=replying([fixture("plain")], sent))
    other = signed_turn(fixture("parallel_calls"), label="gemini:gemini-2.5-pro")
    history = [
        Message.user("Paris, London?"),
        other,
        *(Message.tool(call.id, "sunny") for call in other.tool_calls),
    ]
    async with GeminiDriver(base_url=BASE, api_key=KEY) as gemini:
        result = await Client(gemini, default_model=MODEL).request().with_messages(history).run()
    body = json.dumps(sent[0])
    assert "CsYBAdHtim9PARALLEL" not in body
    model = sent[0]["contents"][1]["parts"]
    assert model[0]["thoughtSignature"] == DUMMY_SIGNATURE  # the current step needs one
    assert "thoughtSignature" not in model[1]
    assert [d.provider for d in result.rounds[0].reasoning_dropped] == ["gemini:gemini-2.5-pro"]
    # The ledger records the placeholder the driver put in.
    [note] = result.rounds[0].replay_notes
    assert DUMMY_SIGNATURE in note


# --- the rules, part by part ---------------------------------------------------


def test_a_call_written_by_hand_gets_the_placeholder_only_in_the_current_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def written(call_id: str) -> Message:
        return Message.assistant(
            "", tool_calls=[ToolCall(id=call_id, name="f"), ToolCall(id=call_id + "b", name="g")]
        )

    caplog.set_level(logging.INFO, logger="threadline.drivers.gemini")
    contents, notes = encoded(
        Message.user("earlier"),
        written("old"),
        Message.tool("old", "1"),
        Message.tool("oldb", "2"),
        Message.assistant("done"),
        Message.user("now"),
        written("new"),
        Message.tool("new", "1"),
        Message.tool("newb", "2"),
    )
    old, new = contents[1]["parts"], contents[5]["parts"]
    assert all("thoughtSignature" not in part for part in old)  # not validated: not sent
    assert new[0]["thoughtSignature"] == DUMMY_SIGNATURE
    assert "thoughtSignature" not in new[1]  # only the first call of a step
    assert new[0]["functionCall"] == {"id": "new", "name": "f", "args": {}}
    assert contents[6]["parts"][0]["functionResponse"] == {
        "id": "new",
        "name": "f",
        "response": {"result": "1"},
    }
    assert len(notes) == 1
    assert "placeholder" in notes[0]
    assert any("placeholder" in record.getMessage() for record in caplog.records)


def test_an_edited_text_part_loses_its_signature_and_the_rest_keep_theirs() -> None:
    turn = signed_turn(fixture("thinking"))
    edited = attrs.evolve(turn, content="A summary: 11.")
    contents, notes = encoded(Message.user("prime?"), edited, Message.user("more"))
    thought, text = contents[1]["parts"]
    assert thought == parts_of(fixture("thinking"))[0]  # the thought part, untouched
    assert text == {"text": "A summary: 11."}
    assert any("without their thought signatures" in note for note in notes)


def test_an_edited_call_loses_its_signature_and_gets_the_placeholder_as_first_of_its_step() -> None:
    turn = signed_turn(fixture("parallel_calls"))
    paris, london = turn.tool_calls
    edited = attrs.evolve(
        turn, tool_calls=(attrs.evolve(paris, arguments='{"city": "Lyon"}'), london)
    )
    contents, _ = encoded(
        Message.user("weather?"), edited, Message.tool(paris.id, "x"), Message.tool(london.id, "y")
    )
    first, second = contents[1]["parts"]
    assert first["functionCall"]["args"] == {"city": "Lyon"}
    assert first["thoughtSignature"] == DUMMY_SIGNATURE  # not the stale one
    assert second == parts_of(fixture("parallel_calls"))[1]


def test_dropping_the_signed_first_call_puts_the_placeholder_on_the_new_first() -> None:
    turn = signed_turn(fixture("parallel_calls"))
    london = turn.tool_calls[1]
    cut = attrs.evolve(turn, tool_calls=(london,))
    contents, _ = encoded(Message.user("weather?"), cut, Message.tool(london.id, "y"))
    [only] = contents[1]["parts"]
    assert only["functionCall"]["args"] == {"city": "London"}
    assert only["thoughtSignature"] == DUMMY_SIGNATURE
    assert "CsYBAdHtim9PARALLEL" not in json.dumps(contents)


def test_calls_a_model_sent_unsigned_stay_unsigned() -> None:
    answer = fixture("parallel_calls")
    del parts_of(answer)[0]["thoughtSignature"]  # a model that signs nothing
    turn = signed_turn(answer)
    results = [Message.tool(call.id, "ok") for call in turn.tool_calls]
    contents, notes = encoded(Message.user("weather?"), turn, *results)
    assert contents[1]["parts"] == parts_of(answer)
    assert notes == ()


def test_stored_parts_that_are_not_a_list_of_parts_are_refused_naming_the_message() -> None:
    bad = Message.assistant(
        "hi", reasoning=Reasoning(provider_reasoning=b'{"x": 1}', provider=LABEL)
    )
    with pytest.raises(InvalidRequestError, match=r"message 1: .*list of the model turn's parts"):
        encoded(Message.user("hi"), bad, Message.user("again"))


# --- the order rules -------------------------------------------------------------


async def test_an_order_gemini_refuses_is_refused_before_any_http_call(
    respx_mock: respx.MockRouter,
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=fixture("plain")))
    calls = Message.assistant(
        "", tool_calls=[ToolCall(id="c1", name="f"), ToolCall(id="c2", name="g")]
    )
    refused = {
        "a result with no call": [Message.user("hi"), Message.tool("c9", "x")],
        "a call left unanswered": [
            Message.user("hi"),
            calls,
            Message.tool("c1", "x"),
            Message.user("go"),
        ],
        "a call unanswered at the end": [Message.user("hi"), calls],
        "a result answered twice": [
            Message.user("hi"),
            calls,
            Message.tool("c1", "x"),
            Message.tool("c1", "y"),
            Message.tool("c2", "z"),
        ],
        "nothing to send": [Message.system("only instructions")],
    }
    async with GeminiDriver(base_url=BASE, api_key=KEY) as gemini:
        for messages in refused.values():
            with pytest.raises(InvalidRequestError):
                await gemini.complete(ProviderCall(model=MODEL, messages=tuple(messages)))
    assert not route.called


def test_a_transcript_cut_to_begin_with_the_model_gets_a_user_turn_first() -> None:
    contents, notes = encoded(Message.assistant("Earlier answer."), Message.user("go on"))
    assert contents[0]["role"] == "user"
    assert [turn["role"] for turn in contents] == ["user", "model", "user"]
    assert any("began with the model" in note for note in notes)


def test_results_are_answered_in_the_calls_order_with_injected_context_after_them() -> None:
    calls = Message.assistant(
        "", tool_calls=[ToolCall(id="c1", name="f"), ToolCall(id="c2", name="g")]
    )
    contents, _ = encoded(
        Message.user("hi"),
        Message.user("and more"),
        calls,
        Message.tool("c2", "second"),
        Message.user("note from the app", origin=Origin.INJECTION),
        Message.tool("c1", "error: failed"),
    )
    assert contents[0]["parts"] == [{"text": "hi"}, {"text": "and more"}]  # merged
    answers = contents[2]["parts"]
    assert [p.get("functionResponse", {}).get("name") for p in answers] == ["f", "g", None]
    assert answers[0]["functionResponse"]["response"] == {"error": "error: failed"}
    assert answers[2] == {"text": "note from the app"}


def test_the_replay_projection_counts_thoughts_and_signatures() -> None:
    gemini = GeminiDriver(base_url=BASE, api_key=KEY)
    reasoning = signed_turn(fixture("thinking")).reasoning
    assert reasoning is not None
    counted = gemini.replay_projection(MODEL).replayed_reasoning(reasoning)
    thought, text = parts_of(fixture("thinking"))
    assert counted == (thought["text"], text["thoughtSignature"])
    assert gemini.replay_projection(MODEL).replayed_reasoning(Reasoning(text="shown")) == ()


def test_a_stored_turn_is_not_changed_by_sending_it() -> None:
    turn = signed_turn(fixture("sequential_calls")["steps"][0])
    before = copy.deepcopy(turn.reasoning)
    call_id = turn.tool_calls[0].id
    encoded(Message.user("go"), turn, Message.tool(call_id, "x"))
    assert turn.reasoning == before


async def test_a_stream_reports_the_placeholder_it_sent_too(respx_mock: respx.MockRouter) -> None:
    from gemini_wire import STREAM_URL, sse_response

    from threadline.drivers import ResponseDone

    respx_mock.post(STREAM_URL).mock(return_value=sse_response(fixture("stream_plain")))
    written = Message.assistant("", tool_calls=[ToolCall(id="c1", name="f")])
    sent = ProviderCall(
        model=MODEL, messages=(Message.user("go"), written, Message.tool("c1", "done"))
    )
    async with GeminiDriver(base_url=BASE, api_key=KEY) as gemini, gemini.stream(sent) as chunks:
        done = [chunk async for chunk in chunks if isinstance(chunk, ResponseDone)]
    [note] = done[0].response.replay_notes
    assert DUMMY_SIGNATURE in note
