"""Server-kept state (``previous_response_id``): which stored response a call continues.

In this opt-in mode every call is sent with ``store: true``, and a call whose
history is exactly what the server holds for an earlier response (that
response's input and its output) sends ``previous_response_id`` and only the
items after it. The check is by content, not by trust: the driver remembers,
for each response it received, a digest of the input items as the next call
would encode them (the history sent, then the reply). A call whose items up
to its last assistant message have another digest (limiting cut something, a
handler edited a message, the history was replaced, the conversation was
restored by another process) is sent whole and stateless, with a note saying
why. So ``previous_response_id`` is never combined with a cut or edited
history: what the server adds from its store plus what is sent is always the
transcript threadline would have sent whole.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Sequence
from typing import Final

import attrs

__all__ = ["Continuation", "ServerState"]

DEFAULT_REMEMBERED: Final = 4096
"""How many responses a driver remembers (about 100 bytes each)."""


@attrs.frozen(kw_only=True)
class Continuation:
    """How one call is sent in server-state mode.

    ``previous_response_id`` is the response it continues (``None``: sent
    whole), ``start`` the first input item sent, ``note`` why a call that
    could have continued a response was sent whole.
    """

    previous_response_id: str | None = None
    start: int = 0
    note: str | None = None


def _digest(items: Sequence[bytes]) -> bytes:
    """A digest of ``items`` in order; each is length-prefixed, so no two lists share one."""
    hashed = hashlib.sha256()
    for item in items:
        hashed.update(len(item).to_bytes(8, "big"))
        hashed.update(item)
    return hashed.digest()


class ServerState:
    """The responses one driver received in server-state mode, by the history they hold.

    Bounded: the least recently used are forgotten first. A forgotten or
    unknown response only means the next call is sent whole.
    """

    __slots__ = ("_histories", "_replies", "_size")

    def __init__(self, size: int = DEFAULT_REMEMBERED) -> None:
        self._size = size
        # digest of the history through a reply -> the response that holds it
        self._histories: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        # digest of a reply's own items -> its response: to say why a call is sent whole
        self._replies: collections.OrderedDict[bytes, str] = collections.OrderedDict()

    def continuation(self, items: Sequence[bytes], reply: tuple[int, int] | None) -> Continuation:
        """How to send input ``items`` whose last assistant message is ``items[slice(*reply)]``
        (``None``: the call has none)."""
        if reply is None:
            return Continuation()
        start, end = reply
        history = _digest(items[:end])
        response = self._histories.get(history)
        if response is not None and end < len(items):
            self._histories.move_to_end(history)
            return Continuation(previous_response_id=response, start=end)
        known = self._replies.get(_digest(items[start:end]))
        if known is None:
            why = (
                "no stored response of this driver is known for the last assistant message "
                "(its first call, a conversation restored elsewhere, or another driver's reply)"
            )
        elif response is not None:
            why = f"nothing is new since {known}"
        else:
            why = (
                f"the history before the reply of {known} is not what was sent with it "
                "(limiting cut it, a handler edited it, or it was replaced)"
            )
        return Continuation(note=f"sent whole, without previous_response_id: {why}")

    def remember(self, items: Sequence[bytes], reply_start: int, response_id: str) -> None:
        """``response_id`` holds ``items``, the input as the next call would encode it
        through the reply, whose own items start at ``reply_start``."""
        for table, key in (
            (self._histories, _digest(items)),
            (self._replies, _digest(items[reply_start:])),
        ):
            table[key] = response_id
            table.move_to_end(key)
            while len(table) > self._size:
                table.popitem(last=False)

    def forget(self, response_id: str) -> None:
        """Never continue ``response_id`` again (the server no longer has it)."""
        for table in (self._histories, self._replies):
            for key in [key for key, value in table.items() if value == response_id]:
                del table[key]
