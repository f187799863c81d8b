"""For any history cut by a handler (whole units dropped), a window (a prefix gone) or an
edit (a summary, a changed call), what the Gemini driver sends obeys Gemini's order rules
and never carries a signature on a part it did not come with."""

from __future__ import annotations

import itertools
import json
from typing import Any

import attrs
import httpx
import pytest
import respx
from gemini_wire import BASE, COUNT_URL, KEY, LABEL, MODEL, URL, fixture, sent_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from threadline import Client, InvalidRequestError, Message, ThreadlineError, ToolCall
from threadline.drivers import ProviderCall
from threadline.drivers.gemini import DUMMY_SIGNATURE, GeminiDriver
from threadline.drivers.gemini._request import encode_request
from threadline.drivers.gemini._response import parse_response
from threadline.limiting import split_units

OTHER = "gemini:gemini-2.5-pro"
KINDS = ("own", "own unsigned", "other model", "hand written")


class Signatures:
    """Hands out signatures no two parts share."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self) -> str:
        self.next += 1
        return f"sig-{self.next:04d}"


def model_turn(kind: str, calls: int, thought: bool, sign: Signatures, step: str) -> Message:
    """A model message as the driver stores it (parsed from a Gemini answer), or written by hand."""
    if kind == "hand written":
        written = [
            ToolCall(id=f"{step}-{k}", name=f"tool{k}", arguments="{}") for k in range(calls)
        ]
        return Message.assistant("" if calls else f"said {step}", tool_calls=written)
    parts: list[dict[str, Any]] = []
    if thought:
        parts.append({"text": f"thinking {step}", "thought": True})
    for k in range(calls):
        parts.append({"functionCall": {"name": f"tool{k}", "args": {"n": k, "step": step}}})
    if not calls:
        parts.append({"text": f"answer {step}"})
    if kind != "own unsigned":
        parts[-1 if not calls else len(parts) - calls]["thoughtSignature"] = sign()
    answer = {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}]
    }
    label = OTHER if kind == "other model" else LABEL
    return parse_response(answer, requested_model="m", provider=label, request_id=None).message


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    sign = Signatures()
    messages: list[Message] = [Message.system("Be brief.")] if draw(st.booleans()) else []
    for turn in range(draw(st.integers(1, 4))):
        messages.append(Message.user(f"question {turn}"))
        for step in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(KINDS))
            calls = draw(st.integers(1, 3))
            made = model_turn(kind, calls, draw(st.booleans()), sign, f"{turn}.{step}")
            messages.append(made)
            results = [Message.tool(c.id, f"result {c.name}") for c in made.tool_calls]
            messages.extend(draw(st.permutations(results)))
        if turn < 3 or draw(st.booleans()):
            kind = draw(st.sampled_from(KINDS))
            messages.append(model_turn(kind, 0, draw(st.booleans()), sign, f"{turn}.end"))
    if messages[-1].role.value == "assistant" or draw(st.booleans()):
        messages.append(Message.user("the prompt"))
    return messages


@st.composite
def cut(draw: st.DrawFn, messages: list[Message]) -> list[Message]:
    """``messages`` after what a handler, a window or an edit may do to them."""
    units = split_units(messages)
    droppable = [unit for unit in units if not unit.pinned]
    dropped = draw(st.sets(st.sampled_from(droppable))) if droppable else set()
    kept = [m for unit in units if unit not in dropped for m in messages[unit.start : unit.end]]
    starts = [k for k, m in enumerate(kept) if m.role.value in ("user", "assistant")]
    window = draw(st.sampled_from(starts)) if draw(st.booleans()) and starts else 0
    if window and not any(m.role.value == "tool" for m in kept[window : window + 1]):
        kept = [m for m in kept[:window] if m.role.value == "system"] + kept[window:]
    model = [k for k, m in enumerate(kept) if m.role.value == "assistant"]
    for index in draw(st.sets(st.sampled_from(model))) if model else ():
        kept[index] = edited(kept[index], draw(st.booleans()))
    return kept


def edited(message: Message, text: bool) -> Message:
    """A summary's rewrite of the text, or a handler's change to the first call."""
    if text or not message.tool_calls:
        return attrs.evolve(message, content=f"(summarised) {message.text}")
    first, *rest = message.tool_calls
    return attrs.evolve(message, tool_calls=(attrs.evolve(first, arguments='{"n": 99}'), *rest))


def stored_parts(messages: list[Message]) -> dict[str, dict[str, Any]]:
    """Every signed part this model stored in ``messages`` that its message still says
    (text unchanged, the call's name and arguments unchanged), by its signature."""
    found: dict[str, dict[str, Any]] = {}
    for message in messages:
        reasoning = message.reasoning
        if reasoning is None or reasoning.provider != LABEL or not reasoning.provider_reasoning:
            continue
        parts = json.loads(reasoning.provider_reasoning)
        texts = [p["text"] for p in parts if "text" in p and not p.get("thought")]
        calls = iter(message.tool_calls)
        for part in parts:
            said = True
            if "functionCall" in part:
                call = next(calls, None)
                said = call is not None and part["functionCall"]["args"] == json.loads(
                    call.arguments
                )
            elif "text" in part and not part.get("thought"):
                said = "".join(texts) == message.text
            if "thoughtSignature" in part and said:
                found[part["thoughtSignature"]] = part
    return found


def check_order(contents: list[dict[str, Any]]) -> None:
    roles = [content["role"] for content in contents]
    assert roles[0] == "user"
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    for position, content in enumerate(contents):
        calls = [p["functionCall"] for p in content["parts"] if "functionCall" in p]
        answers = [p["functionResponse"] for p in content["parts"] if "functionResponse" in p]
        if content["role"] == "user" and answers:
            before = contents[position - 1]["parts"]
            made = [p["functionCall"] for p in before if "functionCall" in p]
            assert [a["name"] for a in answers] == [c["name"] for c in made]
            assert [a.get("id") for a in answers] == [c.get("id") for c in made]
            assert all("functionResponse" in p for p in content["parts"][: len(answers)])
        if calls:
            assert position + 1 < len(contents), "a call with no answer after it"
            after = contents[position + 1]["parts"][: len(calls)]
            assert all("functionResponse" in part for part in after)


def current_turn_start(contents: list[dict[str, Any]]) -> int:
    for position in range(len(contents) - 1, -1, -1):
        content = contents[position]
        if content["role"] == "user" and any("functionResponse" not in p for p in content["parts"]):
            return position + 1
    return 0


def check_signatures(contents: list[dict[str, Any]], stored: dict[str, dict[str, Any]]) -> None:
    start = current_turn_start(contents)
    for position, content in enumerate(contents):
        first_call = next((p for p in content["parts"] if "functionCall" in p), None)
        for part in content["parts"]:
            signature = part.get("thoughtSignature")
            if signature is None:
                continue
            if signature == DUMMY_SIGNATURE:
                assert part is first_call, "a placeholder not on the first call of a step"
                assert position >= start, "a placeholder outside the current turn"
            else:
                assert stored.get(signature) == part, f"{signature} moved or came from elsewhere"


def check(messages: list[Message]) -> None:
    try:
        request = encode_request(ProviderCall(model=MODEL, messages=tuple(messages)), label=LABEL)
    except InvalidRequestError:
        pytest.fail("a cut history of whole units was refused")
    contents = json.loads(request.body)["contents"]
    check_order(contents)
    check_signatures(contents, stored_parts(messages))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_cut_history_is_sent_in_order_with_every_signature_on_its_own_part(
    data: st.DataObject,
) -> None:
    history = data.draw(histories())
    check(data.draw(cut(history)))


@settings(max_examples=200, deadline=None)
@given(histories())
def test_an_uncut_history_sends_every_signature_this_model_made(history: list[Message]) -> None:
    contents = json.loads(
        encode_request(ProviderCall(model=MODEL, messages=tuple(history)), label=LABEL).body
    )["contents"]
    sent = {
        part["thoughtSignature"]
        for content in contents
        for part in content["parts"]
        if "thoughtSignature" in part
    }
    assert set(stored_parts(history)) <= sent
    check_order(contents)


def without_results_of_a_call(history: list[Message]) -> list[Message]:
    """``history`` as a crash mid-tool leaves it: the last call made has no result."""
    made = [m for m in history if m.role.value == "assistant" and m.tool_calls]
    if not made:
        return history
    lost = made[-1].tool_calls[-1].id
    return [m for m in history if m.tool_call_id != lost]


@pytest.mark.anyio
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(histories(), st.integers(100, 700), st.booleans())
async def test_what_a_budgeted_run_sends_obeys_the_rules(
    history: list[Message], budget: int, interrupted: bool
) -> None:
    # The real engine cuts (drop_oldest_units, the default, under a small window), and
    # repairs a history whose results an interruption lost.
    if history[-1].role.value != "user":
        history = [*history, Message.user("the prompt")]
    if interrupted:
        history = without_results_of_a_call(history)
    bodies: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(sent_body(request))
        return httpx.Response(200, json=fixture("plain"))

    with respx.mock(assert_all_called=False) as mock:
        mock.post(URL).mock(side_effect=answer)
        # Near the edge the run asks countTokens; a stand-in count of the body it is sent.
        mock.post(COUNT_URL).mock(
            side_effect=lambda r: httpx.Response(200, json={"totalTokens": len(r.content) // 4})
        )
        async with GeminiDriver(base_url=BASE, api_key=KEY) as gemini:
            client = Client(gemini, default_model=MODEL)
            request = (
                client.request()
                .with_messages(history[:-1])
                .with_prompt(history[-1].text)
                .with_max_context_tokens(budget + 64)
                .with_max_output_tokens(64)
                .with_repair_interrupted_tool_calls()
            )
            try:
                await request.run()
            except ThreadlineError:  # a budget too small for the prompt alone
                refused = True
            else:
                refused = False
    if refused:
        assert not bodies  # refused before anything was sent
        return
    [body] = bodies
    check_order(body["contents"])
    check_signatures(body["contents"], stored_parts(history))
