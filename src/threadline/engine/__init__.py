"""The engine: what turns a request into a run.

``Client`` and the frozen ``ClientDefaults`` a request reads from it;
``Request``, the builder; ``RunPlan``, a checked request; ``Run``, the loop
of rounds (limit, send, run tools, record); ``Agent``, the reusable setup of
requests; and telemetry, which wraps the driver and the tool runner a run is
handed. It sits above the contracts and values of the top level
(``_provider``, ``_messages``, ``_settings``, ...) and ``limiting``,
``counting`` and ``tools``, and below the conversation; it imports no
conversation, no driver and no store (``lint-imports`` checks it).

The modules are private and this package exports no names of its own: the
public ones are published from ``threadline`` (``threadline.Client``) and
``threadline.telemetry``.
"""
