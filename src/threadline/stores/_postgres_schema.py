"""The PostgreSQL layout of ``PostgresStore`` and its migrations.

Schema version 1::

    threadline_schema         (version)
    threadline_conversations  (id, generation, version, format_version, header,
                               metadata, event_count, next_seq, last_write,
                               created_at, updated_at, touched)
    threadline_events         (conversation_id, seq, turn_id, pending, marker, event)
    threadline_touched        a sequence: the write order that sorts the listing

Every write is one call of the ``threadline_write`` function: it locks the
conversation's row, compares the version (and generation), and appends or
replaces the events and the header, all in the one transaction of that
statement, so of two writers based on version 5 exactly one makes version 6.
``last_write`` holds the id of the write that made the current version, so a
write retried after a lost connection can tell that it was already applied.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DELETE",
    "LIST_PAGE",
    "LOAD",
    "MIGRATIONS",
    "REMOVE_PENDING",
    "SCHEMA_VERSION",
    "WRITE",
]

SCHEMA_VERSION: Final = 2
"""The layout this threadline writes, and the newest it reads (2: each pending
event written gets its own marker, so a whole-conversation save keeps them)."""

# An arbitrary constant: the advisory lock that serializes migrations.
MIGRATION_LOCK: Final = 7_362_295_155

_VERSION_1: Final = """
CREATE TABLE threadline_conversations (
    id text PRIMARY KEY,
    generation text NOT NULL,
    version bigint NOT NULL,
    format_version integer NOT NULL,
    header text NOT NULL,
    metadata text NOT NULL,
    event_count integer NOT NULL,
    next_seq bigint NOT NULL,
    last_write text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    touched bigint NOT NULL
);
CREATE UNIQUE INDEX threadline_conversations_touched ON threadline_conversations (touched);
CREATE SEQUENCE threadline_touched;
CREATE TABLE threadline_events (
    conversation_id text NOT NULL,
    seq bigint NOT NULL,
    turn_id integer NOT NULL,
    pending boolean NOT NULL,
    marker text,
    event text NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
CREATE INDEX threadline_events_turn ON threadline_events (conversation_id, turn_id);
CREATE INDEX threadline_events_pending ON threadline_events (conversation_id) WHERE pending;

CREATE FUNCTION threadline_write(
    p_id text, p_expected bigint, p_generation text, p_write_id text,
    p_replace boolean, p_drop_all boolean, p_drop_marker text, p_marker text,
    p_header text, p_metadata text, p_format integer, p_next_turn_id integer,
    p_turn_ids integer[], p_pending boolean[], p_events text[]
) RETURNS TABLE (status text, version bigint, detail text)
LANGUAGE plpgsql AS $fn$
DECLARE
    found_row threadline_conversations%ROWTYPE;
    highest integer;
    removed integer := 0;
    first_seq bigint := 0;
    new_count integer := cardinality(p_events);
BEGIN
    SELECT * INTO found_row FROM threadline_conversations c WHERE c.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        IF p_expected <> 0 THEN
            RETURN QUERY SELECT 'conflict'::text, NULL::bigint, NULL::text;
            RETURN;
        END IF;
        INSERT INTO threadline_conversations AS c (id, generation, version, format_version,
            header, metadata, event_count, next_seq, last_write, created_at, updated_at, touched)
        VALUES (p_id, p_generation, 1, p_format, p_header, p_metadata, new_count, new_count,
            p_write_id, clock_timestamp(), clock_timestamp(), nextval('threadline_touched'))
        ON CONFLICT (id) DO NOTHING;
        IF NOT FOUND THEN  -- another writer created it first
            RETURN QUERY SELECT 'conflict'::text,
                (SELECT c.version FROM threadline_conversations c WHERE c.id = p_id), NULL::text;
            RETURN;
        END IF;
    ELSE
        IF found_row.version = p_expected + 1 AND found_row.last_write = p_write_id THEN
            -- This very write, retried after its answer was lost: it is done.
            RETURN QUERY SELECT 'ok'::text, found_row.version, found_row.generation;
            RETURN;
        END IF;
        IF found_row.version <> p_expected THEN
            RETURN QUERY SELECT 'conflict'::text, found_row.version, NULL::text;
            RETURN;
        END IF;
        IF p_generation IS NOT NULL AND found_row.generation <> p_generation THEN
            RETURN QUERY SELECT 'generation'::text, found_row.version, found_row.generation;
            RETURN;
        END IF;
        IF NOT p_replace AND found_row.format_version <> p_format THEN
            RETURN QUERY SELECT 'format'::text, found_row.version,
                found_row.format_version::text;
            RETURN;
        END IF;
        IF NOT p_replace THEN
            SELECT max(e.turn_id) INTO highest FROM threadline_events e
            WHERE e.conversation_id = p_id
              AND NOT (e.pending AND (p_drop_all OR coalesce(e.marker = p_drop_marker, false)));
            IF highest >= p_next_turn_id THEN
                RETURN QUERY SELECT 'turn'::text, found_row.version, highest::text;
                RETURN;
            END IF;
        END IF;
        -- Every check has passed: write.
        IF p_replace THEN
            DELETE FROM threadline_events e WHERE e.conversation_id = p_id;
            GET DIAGNOSTICS removed = ROW_COUNT;
        ELSE
            first_seq := found_row.next_seq;
            IF p_drop_all OR p_drop_marker IS NOT NULL THEN
                DELETE FROM threadline_events e
                WHERE e.conversation_id = p_id AND e.pending
                  AND (p_drop_all OR coalesce(e.marker = p_drop_marker, false));
                GET DIAGNOSTICS removed = ROW_COUNT;
            END IF;
        END IF;
        UPDATE threadline_conversations c SET
            version = c.version + 1,
            format_version = p_format,
            header = p_header,
            metadata = p_metadata,
            event_count = c.event_count - removed + new_count,
            next_seq = first_seq + new_count,
            last_write = p_write_id,
            updated_at = clock_timestamp(),
            touched = nextval('threadline_touched')
        WHERE c.id = p_id;
    END IF;
    INSERT INTO threadline_events (conversation_id, seq, turn_id, pending, marker, event)
    SELECT p_id, first_seq + x.ord - 1, x.turn_id, x.pending,
        CASE WHEN x.pending THEN p_marker END, x.event
    FROM unnest(p_turn_ids, p_pending, p_events) WITH ORDINALITY AS x(turn_id, pending, event, ord);
    RETURN QUERY SELECT 'ok'::text, coalesce(found_row.version, 0) + 1,
        coalesce(found_row.generation, p_generation);
END
$fn$;

CREATE FUNCTION threadline_remove_pending(p_id text, p_marker text) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    removed integer;
BEGIN
    PERFORM 1 FROM threadline_conversations c WHERE c.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    DELETE FROM threadline_events e
    WHERE e.conversation_id = p_id AND e.pending AND e.marker = p_marker;
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF removed > 0 THEN
        UPDATE threadline_conversations c SET event_count = c.event_count - removed
        WHERE c.id = p_id;
    END IF;
    RETURN removed;
END
$fn$;

CREATE FUNCTION threadline_delete(p_id text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM threadline_conversations c WHERE c.id = p_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM threadline_events e WHERE e.conversation_id = p_id;
    RETURN true;
END
$fn$;
"""


def _per_event_markers(version_1: str) -> str:
    """Schema 2: ``threadline_write`` takes one marker per event (``p_markers``)."""
    start = version_1.index("CREATE FUNCTION threadline_write(")
    function = version_1[start : version_1.index("$fn$;", start) + len("$fn$;")]
    changed = (
        function.replace(
            "p_turn_ids integer[], p_pending boolean[], p_events text[]",
            "p_turn_ids integer[], p_pending boolean[], p_events text[], p_markers text[]",
        )
        .replace("CASE WHEN x.pending THEN p_marker END, x.event", "x.marker, x.event")
        .replace(
            "FROM unnest(p_turn_ids, p_pending, p_events) WITH ORDINALITY "
            "AS x(turn_id, pending, event, ord);",
            "FROM unnest(p_turn_ids, p_pending, p_events, p_markers) WITH ORDINALITY "
            "AS x(turn_id, pending, event, marker, ord);",
        )
    )
    assert changed.count("p_markers") == 2
    assert "x.marker, x.event" in changed
    return (
        "DROP FUNCTION threadline_write(text, bigint, text, text, boolean, boolean, text, "
        "text, text, text, integer, integer, integer[], boolean[], text[]);\n" + changed
    )


_VERSION_2: Final = _per_event_markers(_VERSION_1)

MIGRATIONS: Final = {0: _VERSION_1, 1: _VERSION_2}
"""The script that brings a database from each schema version to the next (0: empty)."""

WRITE: Final = (
    "SELECT status, version, detail FROM threadline_write(%s, %s, %s, %s, %s, %s, %s, %s, "
    "%s, %s, %s, %s, %s::integer[], %s::boolean[], %s::text[], %s::text[])"
)

# One statement, so the header and the events are of one snapshot.
LOAD: Final = """
SELECT c.version, c.generation, c.header,
    ARRAY(SELECT e.seq FROM threadline_events e WHERE e.conversation_id = c.id ORDER BY e.seq),
    ARRAY(SELECT e.event FROM threadline_events e WHERE e.conversation_id = c.id ORDER BY e.seq),
    ARRAY(SELECT e.marker FROM threadline_events e
          WHERE e.conversation_id = c.id AND e.pending ORDER BY e.seq)
FROM threadline_conversations c WHERE c.id = %s
"""

LIST_PAGE: Final = (
    "SELECT id, version, event_count, updated_at, metadata, generation, touched "
    "FROM threadline_conversations WHERE touched < %s ORDER BY touched DESC LIMIT %s"
)

REMOVE_PENDING: Final = "SELECT threadline_remove_pending(%s, %s)"

# One statement, so no migration: the row is locked, then deleted only when its
# version and generation are the ones given (NULL: not checked). Returns whether
# it was deleted and, for the error when it was not, what is stored.
DELETE: Final = """
WITH target AS (
    SELECT c.id, c.version, c.generation FROM threadline_conversations c
    WHERE c.id = %s FOR UPDATE
), gone AS (
    DELETE FROM threadline_conversations c USING target t
    WHERE c.id = t.id
      AND (%s::bigint IS NULL OR t.version = %s::bigint)
      AND (%s::text IS NULL OR t.generation = %s::text)
    RETURNING c.id
), events AS (
    DELETE FROM threadline_events e USING gone g WHERE e.conversation_id = g.id
)
SELECT (SELECT count(*) FROM gone) > 0, (SELECT version FROM target),
    (SELECT generation FROM target)
"""
