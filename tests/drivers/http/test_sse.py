"""The SSE decoder: line endings, fields, comments, and reads split anywhere."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from threadline.drivers._http._sse import ServerSentEvent, SSEDecoder, aiter_sse


def decode_all(*chunks: bytes) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    events.extend(decoder.flush())
    return events


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(max(c, 0), len(data)) for c in cuts})
    pieces, start = [], 0
    for point in points:
        pieces.append(data[start:point])
        start = point
    pieces.append(data[start:])
    return pieces


STREAM = (
    b": keep-alive comment\n"
    b'data: {"a": 1}\n\n'
    b"event: update\r\n"
    b"id: 7\r\n"
    b"data: first line\r\n"
    b"data: second line\r\n\r\n"
    b"retry: 1500\r"
    b'data: {"text": "caf\xc3\xa9 \xe2\x80\xa8 line-separator kept"}\r\r'
    b"data: [DONE]\n\n"
)
EXPECTED = [
    ServerSentEvent(data='{"a": 1}'),
    ServerSentEvent(data="first line\nsecond line", event="update", id="7"),
    ServerSentEvent(data='{"text": "café \u2028 line-separator kept"}', id="7", retry=1500),
    ServerSentEvent(data="[DONE]", id="7"),
]


def test_decodes_fields_comments_and_multiline_data_in_one_read() -> None:
    assert decode_all(STREAM) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_of_the_reads_gives_the_same_events(cuts: list[int]) -> None:
    assert decode_all(*split_at(STREAM, cuts)) == EXPECTED


def test_byte_by_byte_reads_give_the_same_events() -> None:
    assert decode_all(*(STREAM[i : i + 1] for i in range(len(STREAM)))) == EXPECTED


def test_crlf_split_between_reads_is_one_line_ending() -> None:
    events = decode_all(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n")
    assert events == [ServerSentEvent(data="a\nb")]


def test_unicode_line_separators_do_not_end_a_line() -> None:
    # str.splitlines (and so httpx's aiter_lines) would cut these JSON strings apart.
    payload = '{"t": "a\u2028b\u2029c\x85d\x0be"}'
    assert decode_all(f"data: {payload}\n\n".encode()) == [ServerSentEvent(data=payload)]


def test_field_without_space_and_field_without_colon() -> None:
    events = decode_all(b"data:tight\ndata\n\n")
    assert events == [ServerSentEvent(data="tight\n")]


def test_event_without_data_is_not_dispatched_and_does_not_leak_its_type() -> None:
    events = decode_all(b"event: ping\n\ndata: x\n\n")
    assert events == [ServerSentEvent(data="x")]


def test_unknown_fields_and_bad_retry_are_ignored() -> None:
    events = decode_all(b"foo: bar\nretry: soon\ndata: x\n\n")
    assert events == [ServerSentEvent(data="x")]


def test_leading_bom_is_dropped() -> None:
    assert decode_all(b"\xef\xbb\xbfdata: x\n\n") == [ServerSentEvent(data="x")]


def test_a_bom_arriving_alone_is_dropped() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"\xef\xbb\xbf") == []
    assert decoder.feed(b"data: x\n\n") == [ServerSentEvent(data="x")]
    assert decoder.flush() == []


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_bom_split_across_reads_is_dropped(cut: int) -> None:
    bom = b"\xef\xbb\xbf"
    assert decode_all(bom[:cut], bom[cut:] + b"data: x\n\n") == [ServerSentEvent(data="x")]
    assert decode_all(bom[:cut], bom[cut:], b"data: x\n\n") == [ServerSentEvent(data="x")]


def test_a_stream_of_only_a_bom_or_part_of_one_has_no_events() -> None:
    for start in (b"\xef", b"\xef\xbb", b"\xef\xbb\xbf"):
        assert decode_all(start) == []


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM) + 3), max_size=12))
def test_any_split_of_a_stream_opening_with_a_bom_gives_the_same_events(
    cuts: list[int],
) -> None:
    assert decode_all(*split_at(b"\xef\xbb\xbf" + STREAM, cuts)) == EXPECTED


def test_a_bom_after_the_start_of_the_stream_is_not_stripped() -> None:
    # Only the stream's first bytes may be a BOM; later, it is part of a field name
    # ("\ufeffdata"), which is no field at all.
    later = b"data: a\n\n\xef\xbb\xbfdata: b\n\n"
    assert decode_all(later) == [ServerSentEvent(data="a")]
    unterminated = (b"data: a\n\n", b"\xef\xbb\xbfdata: b")
    assert decode_all(*unterminated) == [ServerSentEvent(data="a")]


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert decode_all(b"data: \xff\n\n") == [ServerSentEvent(data="\ufffd")]


def test_pending_event_is_dispatched_when_the_stream_ends_without_a_blank_line() -> None:
    assert decode_all(b"data: last") == [ServerSentEvent(data="last")]
    assert decode_all(b"data: last\n") == [ServerSentEvent(data="last")]


def test_empty_reads_are_harmless() -> None:
    assert decode_all(b"", b"data: x", b"", b"\n", b"", b"\n") == [ServerSentEvent(data="x")]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_aiter_sse_reads_an_async_byte_stream(anyio_backend: str) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for piece in split_at(STREAM, [3, 17, 18, 40, 41, 90, 120]):
            yield piece

    assert [event async for event in aiter_sse(chunks())] == EXPECTED
