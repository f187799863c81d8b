"""The conversation: one thread with an agent, kept turn by turn (private modules).

``Conversation`` and ``Turn`` are published from ``threadline``; this package
holds their parts, split by idea:

- ``_conversation``: the conversation's state and its public face (turns,
  rewrites, loading);
- ``_durability``: what a conversation writes to its store and when (the
  pending prompt, the commit, the abandon, the pending copies); the only code
  that talks to a ``ConversationStore``;
- ``_window``: which messages a turn sends as history, under a window policy
  made once from the settings;
- ``_document``: the saved document (its settings, calibration and kept
  window) and what a document restores;
- ``_transcript`` and ``_packed_events``: the answered transcript, indexed
  and packed so a turn costs what its window costs;
- ``_lock``: one turn at a time.
"""
