"""Mutated saved documents: every one loads well-formed or is a ConversationFormatError.

A seeded mutator takes valid documents (the fixtures of every saved shape and
a few written by threadline itself) and damages them the way disks, editors,
other programs and attackers do: fields dropped, duplicated, renamed,
retyped or reordered; numbers changed, negated, made huge; events swapped,
repeated or lost; the text cut short, given a byte-order mark or bytes that
are not UTF-8. Each case must either load into a document that saves and
loads again unchanged, or raise ``ConversationFormatError``; never anything
else. A failure names the case's seed, so ``mutated(seed)`` gives it back.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    ConversationFormatError,
    Message,
    Model,
    Origin,
    Reasoning,
    ToolCall,
    Usage,
)
from threadline.serialization import (
    ConversationDocument,
    ConversationEvent,
    dumps_conversation,
    dumps_messages,
    loads_conversation,
    loads_messages,
)
from threadline.testing import ScriptedDriver

CASES = 10_000
SEED = 20_251_104
FIXTURES = Path(__file__).parents[1] / "fixtures"

AGENT = Agent(Client(ScriptedDriver([]), default_model=Model("fuzz", context_size=8192)))


def _written_by_threadline() -> list[str]:
    turn = Origin.TURN
    call = ToolCall(id="call_1", name="lookup", arguments='{"city": "Porto"}')
    events = [
        ConversationEvent(message=Message.user("Weather in Porto?", origin=turn), turn_id=0),
        ConversationEvent(
            message=Message.assistant(
                tool_calls=[call],
                reasoning=Reasoning(text="look it up", provider_reasoning=b'{"sig": "x"}'),
                origin=turn,
            ),
            turn_id=0,
            usage=Usage(input_tokens=12, output_tokens=3),
            model="m",
            finish_reason="tool_calls",
        ),
        ConversationEvent(message=Message.tool("call_1", "18 C", origin=turn), turn_id=0),
        ConversationEvent(message=Message.assistant("It is 18 C.", origin=turn), turn_id=0),
        ConversationEvent(message=Message.user("And Lyon?", origin=turn), turn_id=3, pending=True),
        ConversationEvent(message=Message.user("Thanks!", origin=turn), turn_id=1),
        ConversationEvent(message=Message.assistant("You're welcome.", origin=turn), turn_id=1),
    ]
    document = ConversationDocument(
        id="fuzz", history_limit=4, next_turn_id=4, events=events, metadata={"k": "v"}
    )
    messages = [event.message for event in events]
    return [
        dumps_conversation(document),
        dumps_messages(messages),
        dumps_conversation(ConversationDocument(id="empty")),
    ]


BASES: list[str] = [
    (FIXTURES / "conversation_v1.json").read_text(encoding="utf-8"),
    (FIXTURES / "messages_v1.json").read_text(encoding="utf-8"),
    *_written_by_threadline(),
]

HUGE = "\x00a number of 5,000 digits"
"""Written as it says once the tree is JSON again: json.dumps cannot write such an int."""

# Values a field may be replaced with: every JSON type, edge numbers, near misses.
ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**63,
    -(2**63),
    10**400,
    1.5,
    -0.0,
    1e308,
    "",
    " ",
    "x",
    "user",
    "assistant",
    "tool",
    "turn",
    "seed",
    "injection",
    "null",
    "1",
    "{}",
    "[]",
    "2025-01-01T00:00:00",
    "2025-01-01T00:00:00+00:00",
    "\ud800",
    [],
    [None],
    [{}],
    {},
    {"type": "text"},
    {"role": "user"},
]


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*path, index))
    return found


def _at(root: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        root = root[step]
    return root


def _replace(root: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    _at(root, path[:-1])[path[-1]] = value
    return root


def _containers(root: Any, kind: type) -> list[tuple[Any, ...]]:
    return [p for p in _paths(root) if isinstance(_at(root, p), kind) and _at(root, p)]


def _new_number(value: Any, rng: random.Random) -> Any:
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else 1
    as_float = float(number) if abs(number) < 1e300 else 1e308
    return rng.choice(
        [number + 1, number - 1, -number, number * 1000, as_float, bool(number), HUGE]
    )


def _tree_mutation(root: Any, rng: random.Random) -> Any:
    """One structural change somewhere in the parsed document."""
    choice = rng.randrange(11)
    if choice == 10 and (objects := _containers(root, dict)):
        # A field of one object grafted onto another ("pending": true on a reply).
        source = _at(root, rng.choice(objects))
        key = rng.choice(list(source))
        _at(root, rng.choice(objects))[key] = copy.deepcopy(source[key])
    elif choice <= 1 and (objects := _containers(root, dict)):
        target = _at(root, rng.choice(objects))
        del target[rng.choice(list(target))]
    elif choice == 2 and (arrays := _containers(root, list)):
        target = _at(root, rng.choice(arrays))
        target.insert(rng.randrange(len(target) + 1), copy.deepcopy(rng.choice(target)))
    elif choice == 3 and (arrays := _containers(root, list)):
        target = _at(root, rng.choice(arrays))
        i, j = rng.randrange(len(target)), rng.randrange(len(target))
        target[i], target[j] = target[j], target[i]
    elif choice == 4 and (arrays := _containers(root, list)):
        target = _at(root, rng.choice(arrays))
        del target[rng.randrange(len(target))]
    elif choice == 5 and (objects := _containers(root, dict)):
        path = rng.choice(objects)
        items = list(_at(root, path).items())
        rng.shuffle(items)
        root = _replace(root, path, dict(items))
    elif choice == 6 and (objects := _containers(root, dict)):
        target = _at(root, rng.choice(objects))
        key = rng.choice(list(target))
        target[key + rng.choice(["s", "_", "X"]) if rng.random() < 0.5 else "extra"] = target.pop(
            key
        )
    elif choice == 7:
        paths = _paths(root)
        source = copy.deepcopy(_at(root, rng.choice(paths)))
        root = _replace(root, rng.choice(paths), source)
    elif choice == 8:
        paths = [p for p in _paths(root) if isinstance(_at(root, p), int | float)]
        if paths:
            path = rng.choice(paths)
            root = _replace(root, path, _new_number(_at(root, path), rng))
    else:
        root = _replace(root, rng.choice(_paths(root)), copy.deepcopy(rng.choice(ODD_VALUES)))
    return root


def _text_mutation(text: str, rng: random.Random) -> str | bytes:
    """One change to the JSON text itself: what no parsed tree can show."""
    choice = rng.randrange(6)
    if choice == 0:
        return text[: rng.randrange(len(text))]
    if choice == 1:
        return "\ufeff" + text
    if choice == 2:
        # A key written twice in one object: readers disagree on which one wins.
        at = text.find("{", rng.randrange(len(text)))
        return text if at < 0 else text[: at + 1] + '"id": "twice", ' + text[at + 1 :]
    if choice == 3:
        raw = bytearray(text.encode("utf-8"))
        raw[rng.randrange(len(raw))] = rng.choice([0xFF, 0xC3, 0x00, 0x22, 0x5C, 0x7B])
        return bytes(raw)
    if choice == 4:
        return "[" * 50_000 + text + "]" * 50_000
    at = rng.randrange(len(text))
    return (
        text[:at] + rng.choice(["NaN", "Infinity", ",", "}", '"', "\\u12", "1e99999"]) + text[at:]
    )


def mutated(seed: int) -> str | bytes:
    """The document of case ``seed``: a valid one, changed one to three times."""
    rng = random.Random(seed)
    base = rng.choice(BASES)
    if rng.random() < 0.2:
        return _text_mutation(base, rng)
    tree = json.loads(base)
    for _ in range(rng.randint(1, 3)):
        tree = _tree_mutation(tree, rng)
    return json.dumps(tree).replace(json.dumps(HUGE), "9" * 5000)


def _conversation_case(text: str | bytes) -> None:
    try:
        document = loads_conversation(text)
    except ConversationFormatError:
        return
    # Well-formed: it saves, loads back the same, and a conversation can open it.
    assert loads_conversation(dumps_conversation(document)) == document
    try:
        Conversation.from_json(AGENT, text)
    except ConversationFormatError:
        return


def _messages_case(text: str | bytes) -> None:
    try:
        messages = loads_messages(text)
    except ConversationFormatError:
        return
    saved = [message for message in messages if message.origin is not Origin.INJECTION]
    assert loads_messages(dumps_messages(saved)) == saved


def _shown(text: str | bytes) -> str:
    return repr(text if len(text) < 600 else text[:300])


@pytest.mark.parametrize(
    "load", [_conversation_case, _messages_case], ids=["conversation", "messages"]
)
def test_every_mutated_document_loads_well_formed_or_is_refused(
    load: Callable[[str | bytes], None],
) -> None:
    for seed in range(SEED, SEED + CASES):
        text = mutated(seed)
        try:
            load(text)
        except AssertionError as exc:
            raise AssertionError(f"mutated({seed}) loads but is not well-formed") from exc
        except Exception as exc:
            raise AssertionError(
                f"mutated({seed}) raised {type(exc).__name__}: {exc}; document {_shown(text)}"
            ) from exc


def test_the_mutator_makes_both_loadable_and_refused_cases() -> None:
    # A mutator that only ever broke (or never broke) documents would prove little.
    loaded = refused = 0
    for seed in range(SEED, SEED + 400):
        try:
            loads_conversation(mutated(seed))
        except ConversationFormatError:
            refused += 1
        else:
            loaded += 1
    assert loaded > 20
    assert refused > 100
