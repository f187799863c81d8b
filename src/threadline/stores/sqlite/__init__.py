"""``SQLiteStore``: conversations in one SQLite file, the embedded default.

The layout, schema version 2::

    threadline_schema         (version)
    threadline_conversations  (id, version, format_version, header, metadata,
                               event_count, created_at, updated_at, touched,
                               generation)
    threadline_events         (conversation_id, seq, turn_id, pending, event, marker)

A file of schema version 1 (no generation, no marker) is migrated when opened.

``header`` is the saved conversation without its events and ``event`` one
event, both JSON of ``_serialization``'s format; every event of a
conversation is in the ``format_version`` of the conversation's row (an older
conversation is rewritten whole when it is next written). Appending a turn writes
the turn's rows and the header, never the whole transcript. Writes run in
``BEGIN IMMEDIATE`` transactions, so the version check and the write are one
step even when several processes share the file.

Where it lives: the store in ``_store``; telling whether the file is still
the one opened, and switching it to WAL, in ``_file``; read-only connections
in ``_read_only``.
"""

from threadline._public import publish
from threadline.stores.sqlite._store import SCHEMA_VERSION, SQLiteStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

publish(globals(), __all__, __name__)
