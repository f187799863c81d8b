"""The JSON cache frames a plain message as the driver would, and stays within its bound."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadline import InvalidRequestError, Message, Role
from threadline.drivers._http._wire import JSONCache
from threadline.drivers.anthropic._request import encode_message_blocks
from threadline.drivers.openai_chat._wire import _encode_message_json
from threadline.drivers.openai_responses._request import encode_message_items

ENCODERS: dict[str, Callable[[Message], bytes]] = {
    "openai-chat": _encode_message_json,
    "anthropic": encode_message_blocks,
    "openai-responses": encode_message_items,
}
PLAIN_ROLES = st.sampled_from([Role.SYSTEM, Role.USER, Role.ASSISTANT])


@pytest.mark.parametrize("driver", sorted(ENCODERS))
@given(role=PLAIN_ROLES, text=st.text(min_size=1))
def test_a_plain_message_is_framed_exactly_as_the_driver_encodes_it(
    driver: str, role: Role, text: str
) -> None:
    encode = ENCODERS[driver]
    cache = JSONCache(encode, min_messages=1)
    message = Message(role=role, content=text)
    try:
        expected = encode(message)
    except InvalidRequestError:  # a lone surrogate: the driver's own error, through the cache too
        with pytest.raises(InvalidRequestError):
            cache.get(message)
        return
    assert cache.get(message) == expected
    assert cache.encode((message, message)) == b"[" + expected + b"," + expected + b"]"


@pytest.mark.parametrize("driver", sorted(ENCODERS))
def test_messages_are_kept_within_the_bound(driver: str) -> None:
    encode = ENCODERS[driver]
    cache = JSONCache(encode, max_bytes=4_000, min_messages=1)
    named = [
        Message.user(f"number {i}", name="ada") if i % 2 else Message.user(f"number {i}")
        for i in range(500)
    ]
    empty = Message.assistant("")
    for message in (*named, empty):
        assert cache.get(message) == encode(message)
    assert 0 < len(cache) < 200  # two generations of 2,000 bytes: the oldest forgotten
    assert named[-1] in cache
    assert named[0] not in cache


@st.composite
def batches(draw: st.DrawFn) -> list[Message]:
    """Plain messages of any text (non-ASCII and lone surrogates too), some named or
    empty, some repeated: what a first request's history holds."""
    messages: list[Message] = []
    for _ in range(draw(st.integers(1, 12))):
        known = st.sampled_from(["hi", "日本 🙂", "", "del \x7f"])
        text = draw(st.one_of(st.text(max_size=30), known))
        role = draw(PLAIN_ROLES)
        name = draw(st.one_of(st.none(), st.just("ada"))) if role is Role.USER else None
        messages.append(Message(role=role, content=text, name=name))
        if draw(st.booleans()):
            messages.append(messages[draw(st.integers(0, len(messages) - 1))])
    return messages


@pytest.mark.parametrize("driver", sorted(ENCODERS))
@settings(deadline=None)  # a shared machine: the first example may take long
@given(messages=batches(), warm=st.booleans())
def test_a_cold_batch_is_encoded_exactly_as_the_driver_encodes_each_message(
    driver: str, messages: list[Message], warm: bool
) -> None:
    encode = ENCODERS[driver]
    cache = JSONCache(encode, min_messages=1)
    try:
        expected = [encode(message) for message in messages]
    except InvalidRequestError:  # a lone surrogate: the driver's own error, batch or not
        with pytest.raises(InvalidRequestError):
            cache.encode(tuple(messages))
        return
    if warm:  # some of the batch known already: the misses are filled around them
        cache.encode(tuple(messages[::2]))
    assert cache.encode(tuple(messages)) == b"[" + b",".join(expected) + b"]"
    assert all(message in cache for message in messages)


def test_messages_are_found_by_identity_and_never_hashed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hashing an attrs message keeps its hash on it for good: 64 bytes a message,
    # a fifth of what a conversation's messages take (benchmarks/bench_memory.py).
    def no_hash(message: Message) -> int:
        raise AssertionError("the JSON cache hashed a message")

    messages = tuple(Message.user(f"number {i}") for i in range(100))
    encode = ENCODERS["openai-chat"]
    cache = JSONCache(encode, min_messages=1)
    monkeypatch.setattr(Message, "__hash__", no_hash)
    first = cache.encode(messages)
    assert cache.encode(messages) == first
    copy = Message.user("number 0")  # equal, not the same object: encoded again, equally
    assert copy not in cache
    assert cache.get(copy) == encode(copy)
    assert copy in cache
