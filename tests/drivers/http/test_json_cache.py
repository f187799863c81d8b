"""The JSON cache frames a plain message as the driver would, and stays within its bound."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
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
