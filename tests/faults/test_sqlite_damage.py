"""A damaged or vanished SQLite file: every store call either works or raises a
``StoreError`` (or ``ConversationFormatError``) naming the file, never a raw
``sqlite3`` error; a file deleted while the store has it open is noticed
before anything is written to the unlinked inode."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from threadline import (
    ConcurrentModificationError,
    ConversationFormatError,
    ConversationNotFoundError,
    Message,
    Origin,
    StoreError,
)
from threadline.serialization import ConversationDocument, ConversationEvent
from threadline.stores.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio

PAGE = 4096


def document(conversation_id: str) -> ConversationDocument:
    events = []
    for turn in range(3):
        events.append(
            ConversationEvent(
                message=Message.user(f"q{turn} " * 40, origin=Origin.TURN), turn_id=turn
            )
        )
        events.append(
            ConversationEvent(
                message=Message.assistant(f"a{turn} " * 40, origin=Origin.TURN), turn_id=turn
            )
        )
    return ConversationDocument(id=conversation_id, next_turn_id=3, events=tuple(events))


def _truncate(size: Callable[[int], int]) -> Callable[[bytearray], bytes]:
    return lambda data: bytes(data[: size(len(data))])


def _overwrite(
    offset: Callable[[int], int], length: int, fill: bytes
) -> Callable[[bytearray], bytes]:
    def damage(data: bytearray) -> bytes:
        start = offset(len(data))
        data[start : start + length] = (fill * length)[:length]
        return bytes(data)

    return damage


def _scribble_pages(step: int) -> Callable[[bytearray], bytes]:
    def damage(data: bytearray) -> bytes:
        for start in range(PAGE, len(data), PAGE * step):
            data[start : start + 64] = b"\xff" * 64
        return bytes(data)

    return damage


def _random_bytes(seed: int) -> Callable[[bytearray], bytes]:
    def damage(data: bytearray) -> bytes:
        rng = random.Random(seed)
        for _ in range(200):
            data[rng.randrange(PAGE, len(data))] = rng.randrange(256)
        return bytes(data)

    return damage


def _swap_pages(data: bytearray) -> bytes:
    pages = [data[i : i + PAGE] for i in range(0, len(data), PAGE)]
    pages[1], pages[-1] = pages[-1], pages[1]
    return b"".join(pages)


DAMAGE: dict[str, Callable[[bytearray], bytes]] = {
    "empty": _truncate(lambda n: 0),
    "10 bytes": _truncate(lambda n: 10),
    "half the header": _truncate(lambda n: 50),
    "header only": _truncate(lambda n: 100),
    "first page only": _truncate(lambda n: PAGE),
    "half a page": _truncate(lambda n: PAGE + PAGE // 2),
    "half the file": _truncate(lambda n: n // 2),
    "last byte gone": _truncate(lambda n: n - 1),
    "last page gone": _truncate(lambda n: n - PAGE),
    "magic broken": _overwrite(lambda n: 0, 16, b"X"),
    "page size broken": _overwrite(lambda n: 16, 2, b"\x00\x03"),
    "page count broken": _overwrite(lambda n: 28, 4, b"\xff"),
    "schema cookie broken": _overwrite(lambda n: 40, 4, b"\x7f"),
    "schema page zeroed": _overwrite(lambda n: 100, PAGE - 100, b"\x00"),
    "every page scribbled": _scribble_pages(1),
    "every other page scribbled": _scribble_pages(2),
    "last page zeroed": _overwrite(lambda n: n - PAGE, PAGE, b"\x00"),
    "middle page zeroed": _overwrite(lambda n: (n // PAGE // 2) * PAGE, PAGE, b"\x00"),
    "random bytes": _random_bytes(1),
    "more random bytes": _random_bytes(2),
    "pages swapped": _swap_pages,
    "text instead": lambda data: b"this is not a database\n" * 500,
}


async def written(path: Path) -> None:
    async with SQLiteStore(path) as store:
        for index in range(40):
            await store.save(document(f"c{index}"), expected_version=0)


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
async def test_a_damaged_file_fails_only_as_a_store_error_naming_it(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "damaged.db"
    await written(path)
    damaged(path, damage)
    await check_every_call(path)


async def test_a_file_truncated_while_the_store_has_it_open(tmp_path: Path) -> None:
    path = tmp_path / "truncated.db"
    await written(path)
    async with SQLiteStore(path) as store:
        await store.load("c1")  # open, with pages cached
        cut_to_a_third(path)
        await check_calls(store, str(path))


def cut_to_a_third(path: Path) -> None:
    with path.open("r+b") as file:
        file.truncate(os.path.getsize(path) // 3)


def delete_with_leftovers(path: Path) -> None:
    path.unlink()
    for leftover in path.parent.glob(path.name + "-*"):
        leftover.unlink()


def damaged(path: Path, damage: str) -> None:
    path.write_bytes(DAMAGE[damage](bytearray(path.read_bytes())))


async def check_every_call(path: Path) -> None:
    async with SQLiteStore(path) as store:
        await check_calls(store, str(path))


async def check_calls(store: SQLiteStore, named: str) -> None:
    calls = [
        store.list,
        lambda: store.load("c7"),
        lambda: store.append_events(
            "c7",
            [
                ConversationEvent(
                    message=Message.user("more", origin=Origin.TURN), turn_id=3, pending=True
                )
            ],
            header=attrs.evolve(document("c7"), next_turn_id=4, events=()),
            expected_version=1,
        ),
        lambda: store.save(document("new"), expected_version=0),
        lambda: store.delete("c3"),
    ]
    unnamed: list[str] = []
    for call in calls:
        try:
            await call()
        except (ConversationNotFoundError, ConcurrentModificationError):
            pass  # what a sound file says about a conversation it lost or never had
        except (StoreError, ConversationFormatError) as exc:
            if named not in str(exc):
                unnamed.append(str(exc))
        # Anything else (a raw sqlite3.DatabaseError, an IndexError) fails the test.
    assert unnamed == []


async def test_a_file_deleted_while_open_is_noticed_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "deleted.db"
    await written(path)
    async with SQLiteStore(path) as store:
        await store.load("c1")
        delete_with_leftovers(path)
        with pytest.raises(StoreError, match="deleted") as caught:
            await store.save(document("after"), expected_version=0)
        assert str(path) in str(caught.value)
