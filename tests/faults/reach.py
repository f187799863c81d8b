"""Everything a raised exception lets a caller (or a logging handler) reach.

``logging.exception`` prints an error's chain; a debugger, Sentry or a
careless ``vars(exc)`` reads its attributes. So an exception is walked
through all of it: ``__cause__``, ``__context__``, ``args``, ``__notes__``,
an exception group's members, every attribute (a ``JSONDecodeError``'s
``doc``, an httpx error's ``request`` and its headers), and whatever those
hold, as text or bytes. The frames of its traceback are not walked: they are
the code that ran, and their locals hold the request that was being sent.
"""

from __future__ import annotations

import traceback
import types
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["assert_unreachable", "reachable_texts"]

_OPAQUE = (
    type(None),
    bool,
    int,
    float,
    complex,
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.TracebackType,
    types.FrameType,
    types.CodeType,
)


def _slots(obj: object) -> Iterator[tuple[str, Any]]:
    for klass in type(obj).__mro__:
        names = klass.__dict__.get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if hasattr(obj, name) and name not in ("__dict__", "__weakref__"):
                yield name, getattr(obj, name)


def _children(obj: object) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, BaseException):
        yield "str()", _text_of(str, obj)
        yield "repr()", _text_of(repr, obj)
        yield "__cause__", obj.__cause__
        yield "__context__", obj.__context__
        yield "args", obj.args
        yield "__notes__", getattr(obj, "__notes__", None)
        if isinstance(obj, BaseExceptionGroup):
            yield "exceptions", obj.exceptions
    if isinstance(obj, Mapping):
        for index, (key, value) in enumerate(obj.items()):
            yield f"[key {index}]", key
            yield f"[{key!r}]", value
    elif isinstance(obj, list | tuple | set | frozenset):
        for index, item in enumerate(obj):
            yield f"[{index}]", item
    yield from ((f".{name}", value) for name, value in getattr(obj, "__dict__", {}).items())
    yield from ((f".{name}", value) for name, value in _slots(obj))


def _text_of(render: Any, exc: BaseException) -> str:
    try:
        text: str = render(exc)
    except Exception as failure:  # a broken __str__ is reported, not hidden
        return f"<{render.__name__} raised {failure!r}>"
    return text


def reachable_texts(root: object, *, limit: int = 100_000) -> Iterator[tuple[str, str | bytes]]:
    """``(path, text)`` for every string and byte string reachable from ``root``."""
    seen: set[int] = set()
    stack: list[tuple[str, object]] = [("exc", root)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        assert len(seen) <= limit, f"more than {limit} objects reachable from the error"
        if isinstance(obj, str | bytes | bytearray | memoryview):
            yield path, obj if isinstance(obj, str | bytes) else bytes(obj)
            continue
        stack.extend((path + step, child) for step, child in _children(obj))


def assert_unreachable(secret: str, error: BaseException) -> None:
    """No copy of ``secret`` is reachable from ``error``, nor in its printed traceback."""
    for path, text in reachable_texts(error):
        found = secret in text if isinstance(text, str) else secret.encode() in text
        assert not found, f"the secret is reachable at {path}"
    rendered = "".join(traceback.format_exception(error))
    assert secret not in rendered, "the secret is in the printed traceback"
