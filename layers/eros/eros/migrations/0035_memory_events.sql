-- 0035 — memory events (issue 32): every change of a user's memory is an event other systems can act on.
--
-- engine.memory_events is an outbox: a row is written by the change's own transaction (the triggers of
-- sql/functions/events.sql, on companion_memories and chat_sessions), so an event exists exactly when its change
-- was committed, once; the sweeper publishes the rows in order and deletes them (eros.events: at least once to a
-- subscriber, which tells a repeat by the event's id). A row carries ids and metadata, never text: a memory's text
-- is read at publish time, and only when the deployment opts in (EVENTS_INCLUDE_TEXT).
--
-- ``seq`` numbers a user's events 1, 2, 3... in the order their changes committed: engine.user_event_sequence is
-- the counter, whose row a change's transaction holds locked until it commits, so a later change of the same user
-- numbers after it and commits after it. A subscriber reorders by it and sees a gap as a missed event.
CREATE TABLE IF NOT EXISTS engine.user_event_sequence (
    user_id text PRIMARY KEY,
    last    bigint NOT NULL CHECK (last >= 1)
);

CREATE TABLE IF NOT EXISTS engine.memory_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id     text NOT NULL,
    seq         bigint NOT NULL CHECK (seq >= 1),
    type        text NOT NULL CHECK (type IN ('session.extracted', 'memory.created', 'memory.superseded',
                                              'memory.merged', 'memory.edited', 'memory.restored', 'memory.deleted',
                                              'user.erased')),
    memory_id   uuid,
    session_id  uuid,
    detail      jsonb NOT NULL DEFAULT '{}',
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (user_id, seq)
);
