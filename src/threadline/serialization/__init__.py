"""Serialization: versioned JSON for conversations and message lists.

One cattrs converter writes and reads every document; older format versions
are migrated on load, and a document that cannot be loaded raises
``ConversationFormatError`` naming where it is wrong. See docs/persistence.md.
"""

from threadline._public import publish
from threadline.serialization._converter import (
    FORMAT_VERSION,
    ConversationDocument,
    ConversationEvent,
    dumps_conversation,
    dumps_messages,
    loads_conversation,
    loads_messages,
)

__all__ = [
    "FORMAT_VERSION",
    "ConversationDocument",
    "ConversationEvent",
    "dumps_conversation",
    "dumps_messages",
    "loads_conversation",
    "loads_messages",
]

publish(globals(), __all__, __name__)
