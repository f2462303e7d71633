-- Memory events: the outbox rows a change writes in its own transaction (current definitions; README.md here says
-- how this file is applied). Migration 0035 made the tables and says why an outbox, and what ``seq`` is.
--
-- Triggers, not calls in each store module: every path that changes a memory (dreaming's write and its
-- consolidation, the deep pass, the memory API, erasure, a future one) is covered by the one definition here, and an
-- event cannot be forgotten or written twice. Profile-layer rows (instance_id IS NULL) and episodes (source
-- 'episode': a session's story, kept per persona instance); not the relationship layer's utterances, written on
-- every chat turn and not memories a subscriber acts on (the WHEN clauses keep a turn's insert from calling
-- anything). What the change was is read from the row:
--
-- * INSERT                                  -> memory.created (a new version of an edited fact too: its old
--                                              version's event says what happened to it)
-- * superseded_at set, reason 'edited'      -> memory.edited (the successor in detail.superseded_by)
-- * reason 'duplicate'                      -> memory.merged
-- * any other reason ('changed', ...)       -> memory.superseded
-- * superseded_at cleared                   -> memory.restored
-- * an episode's text rewritten in place    -> memory.edited (the user's edit, or dreaming extending the episode
--                                              of a resumed session; no superseded_by)
-- * DELETE                                  -> memory.deleted, unless the transaction erases the user
--                                              (engine.erasing: one user.erased event says it all)
-- * chat_sessions.extracted_at set          -> session.extracted

-- The next event number of a user, the counter row locked until the transaction ends (migration 0035). A user
-- without a counter starts after their events still waiting: an erasure deletes the counter (it names the user) but
-- leaves its user.erased event until it is published, and the user may come back before that.
CREATE OR REPLACE FUNCTION engine.next_event_seq(of_user text) RETURNS bigint
LANGUAGE sql
AS $$
    INSERT INTO engine.user_event_sequence AS s (user_id, last)
    VALUES (of_user, 1 + coalesce((SELECT max(e.seq) FROM engine.memory_events e WHERE e.user_id = of_user), 0))
    ON CONFLICT (user_id) DO UPDATE SET last = s.last + 1
    RETURNING s.last
$$;

-- One event in the outbox. Its number first, then its row: the row's id is drawn once the user's counter is this
-- transaction's, so a user's events are in id order as they are in seq order (the drainer reads by id), even when
-- another transaction of the same user began its insert first and waited for the counter.
CREATE OR REPLACE FUNCTION engine.record_event(of_user text, of_type text, of_memory uuid, of_session uuid,
                                               of_detail jsonb) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    numbered bigint := engine.next_event_seq(of_user);
BEGIN
    INSERT INTO engine.memory_events (user_id, seq, type, memory_id, session_id, detail)
    VALUES (of_user, numbered, of_type, of_memory, of_session, of_detail);
END
$$;

-- True in a transaction that erases a user (eros.store.account.erase sets it): its deletions are one event.
CREATE OR REPLACE FUNCTION engine.erasing() RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT coalesce(current_setting('eros.erasing', true), '') = 'on' $$;

-- False on a connection that set eros.events = 'off': a bulk load of many users' rows (the benches' data sets, an
-- operator's seeding) that is not a change anyone is told of. It also keeps such a load, whose transactions each
-- write many users' rows in no common order, from taking their event counters in opposite orders (a deadlock).
-- The engine never sets it.
CREATE OR REPLACE FUNCTION engine.events_on() RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT coalesce(current_setting('eros.events', true), '') <> 'off' $$;

CREATE OR REPLACE FUNCTION engine.record_memory_event() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    row_now engine.companion_memories;
    kind text;
BEGIN
    IF NOT engine.events_on() THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF engine.erasing() THEN
            RETURN NULL;
        END IF;
        row_now := OLD;
        kind := 'memory.deleted';
    ELSIF TG_OP = 'INSERT' THEN
        row_now := NEW;
        kind := 'memory.created';
    ELSIF NEW.superseded_at IS NOT DISTINCT FROM OLD.superseded_at THEN  -- an episode rewritten in place
        row_now := NEW;
        kind := 'memory.edited';
    ELSIF NEW.superseded_at IS NULL THEN
        row_now := NEW;
        kind := 'memory.restored';
    ELSE
        row_now := NEW;
        kind := CASE NEW.superseded_reason WHEN 'edited' THEN 'memory.edited' WHEN 'duplicate' THEN 'memory.merged'
                                           ELSE 'memory.superseded' END;
    END IF;
    PERFORM engine.record_event(row_now.user_id, kind, row_now.id, row_now.session_id, jsonb_strip_nulls(
        jsonb_build_object('category', row_now.category, 'source', row_now.source,
                           'chain_id', coalesce(row_now.chain_id, row_now.id),
                           'superseded_by', CASE WHEN TG_OP = 'UPDATE' THEN row_now.superseded_by END,
                           'reason', CASE WHEN TG_OP = 'UPDATE' THEN row_now.superseded_reason END)));
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER companion_memories_event_on_insert
    AFTER INSERT ON engine.companion_memories
    FOR EACH ROW WHEN (NEW.instance_id IS NULL OR NEW.source = 'episode')
    EXECUTE FUNCTION engine.record_memory_event();
CREATE OR REPLACE TRIGGER companion_memories_event_on_supersession
    AFTER UPDATE OF superseded_at ON engine.companion_memories
    FOR EACH ROW WHEN ((NEW.instance_id IS NULL OR NEW.source = 'episode')
                       AND NEW.superseded_at IS DISTINCT FROM OLD.superseded_at
                       AND (NEW.superseded_at IS NULL OR OLD.superseded_at IS NULL))
    EXECUTE FUNCTION engine.record_memory_event();
CREATE OR REPLACE TRIGGER companion_memories_event_on_episode_rewrite
    AFTER UPDATE OF content ON engine.companion_memories
    FOR EACH ROW WHEN (NEW.source = 'episode' AND NEW.content IS DISTINCT FROM OLD.content
                       AND NEW.superseded_at IS NOT DISTINCT FROM OLD.superseded_at)
    EXECUTE FUNCTION engine.record_memory_event();
CREATE OR REPLACE TRIGGER companion_memories_event_on_delete
    AFTER DELETE ON engine.companion_memories
    FOR EACH ROW WHEN (OLD.instance_id IS NULL OR OLD.source = 'episode')
    EXECUTE FUNCTION engine.record_memory_event();

CREATE OR REPLACE FUNCTION engine.record_session_event() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT engine.events_on() THEN
        RETURN NULL;
    END IF;
    PERFORM engine.record_event(NEW.user_id, 'session.extracted', NULL, NEW.id, jsonb_strip_nulls(
        jsonb_build_object('through_message_id', NEW.extraction_watermark)));
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER chat_sessions_event_on_extraction
    AFTER UPDATE OF extracted_at ON engine.chat_sessions
    FOR EACH ROW WHEN (OLD.extracted_at IS NULL AND NEW.extracted_at IS NOT NULL)
    EXECUTE FUNCTION engine.record_session_event();
