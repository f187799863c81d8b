"""Every HTTP driver sends the same bytes with its JSON cache as without it, cold or warm
(hypothesis): the cache's batch lookups and each driver's fast path change no byte."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from threadline import Message, Model, ToolCall
from threadline.drivers import ProviderCall

# The encoders and their caches are private to their rooms: tested at the encoder.
from threadline.drivers._http._wire import JSONCache
from threadline.drivers.anthropic import _request as anthropic
from threadline.drivers.gemini import _contents as gemini_contents
from threadline.drivers.gemini import _request as gemini
from threadline.drivers.openai_chat import _wire as openai_chat
from threadline.drivers.openai_responses import _request as responses

MODEL = Model("m")
Encode = Callable[[ProviderCall, "JSONCache | None"], bytes]


def _anthropic(breakpoints: bool) -> Encode:
    def encode(call: ProviderCall, cache: JSONCache | None) -> bytes:
        encoded = anthropic.encode_request(
            call,
            stream=False,
            label="anthropic:m",
            default_max_tokens=64,
            cache=cache,
            breakpoints=breakpoints,
        )
        return encoded.body

    return encode


ENCODERS: dict[str, tuple[Encode, Callable[[], JSONCache]]] = {
    "openai-chat": (
        lambda call, cache: openai_chat.encode_request(
            call,
            stream=False,
            cache=cache,  # type: ignore[arg-type]
        ),
        openai_chat.MessageJSONCache,
    ),
    "anthropic": (_anthropic(False), lambda: JSONCache(anthropic.encode_message_blocks)),
    "anthropic, prompt caching": (
        _anthropic(True),
        lambda: JSONCache(anthropic.encode_message_blocks),
    ),
    "openai-responses": (
        lambda call, cache: (
            responses.encode_request(
                call, stream=False, label="openai-responses:m", cache=cache
            ).body
        ),
        responses.new_message_cache,
    ),
    "gemini": (
        lambda call, cache: gemini.encode_request(call, label="gemini:m", cache=cache).body,
        gemini_contents.new_message_cache,
    ),
}

texts = st.one_of(st.text(max_size=12), st.sampled_from(["", "日本 🙂", "a\nb", "del \x7f"]))


@st.composite
def transcripts(draw: st.DrawFn) -> list[Message]:
    """Long enough for the cache (64 messages and up): system messages anywhere,
    replies in a row, empty texts, tool exchanges."""
    messages = [Message.system(draw(texts) or "Be brief.")]
    calls = 0
    while len(messages) < draw(st.integers(64, 90)):
        kind = draw(st.sampled_from(["user", "assistant", "assistant", "system", "tools"]))
        if kind == "user":
            messages.append(Message.user(draw(texts) or "?"))
        elif kind == "assistant":
            messages.append(Message.assistant(draw(texts)))
        elif kind == "system":
            messages.append(Message.system(draw(texts) or "Note."))
        else:
            ids = [f"call_{calls}_{k}" for k in range(draw(st.integers(1, 2)))]
            calls += 1
            called = [ToolCall(id=i, name="f", arguments="{}") for i in ids]
            messages.append(Message.assistant(draw(texts), tool_calls=called))
            messages.extend(Message.tool(i, draw(texts)) for i in ids)
    messages.append(Message.user(draw(texts) or "and now?"))
    return messages


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """A conversation's history: a system message, then a user message and a reply in
    turn, each with text (one message a turn, what the drivers' fast paths take)."""
    turns = draw(st.integers(32, 45))
    said = st.text(min_size=1, max_size=12)
    messages = [Message.system(draw(said))]
    for _ in range(turns):
        messages += [Message.user(draw(said)), Message.assistant(draw(said))]
    messages.append(Message.user(draw(said)))
    return messages


@pytest.mark.parametrize("driver", sorted(ENCODERS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transcript=st.one_of(transcripts(), conversations()), warm=st.booleans())
def test_a_cached_transcript_is_sent_byte_for_byte_as_an_uncached_one(
    driver: str, transcript: list[Message], warm: bool
) -> None:
    encode, new_cache = ENCODERS[driver]
    call = ProviderCall(model=MODEL, messages=tuple(transcript))
    try:
        expected = encode(call, None)
    except Exception as exc:  # a transcript this API refuses: refused the same with the cache
        with pytest.raises(type(exc)):
            encode(call, new_cache())
        return
    cache = new_cache()
    if warm:  # the history sent before, the last message new
        encode(ProviderCall(model=MODEL, messages=tuple(transcript[:-1])), cache)
    assert encode(call, cache) == expected
    assert encode(call, cache) == expected  # and again, every message a hit
