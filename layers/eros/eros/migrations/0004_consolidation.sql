-- 0004 — consolidation ("true dreaming"): what the engine learns changes what it already knows.
--
-- A memory is *active* while superseded_at IS NULL. Consolidation never deletes: a changed fact
-- ("lives in Shanghai" after "moved to Tokyo") or a repeat merged into its twin gets a validity
-- end (superseded_at), the row that replaced it (superseded_by) and why (superseded_reason). It
-- stays listable as history and can be restored; recall reads active rows only.
-- The relationship layer's raw utterances that stated a fact which changed ("I live in Shanghai")
-- leave recall with it: reason 'outdated', superseded_by naming the profile row they stated, so
-- that restoring that row brings them back.
-- Real columns rather than metadata keys, so that recall's filter and the partial indexes below
-- are plain column predicates, and the history is a foreign key that can be followed both ways.

ALTER TABLE engine.companion_memories
    -- Who wrote the row: a raw chat utterance (relationship layer), session-end dreaming, the
    -- per-user deep pass, or the user directly (API).
    ADD COLUMN source text,
    -- Provenance: the message range of the session the row was distilled from (an utterance:
    -- its own message on both ends).
    ADD COLUMN from_message_id bigint,
    ADD COLUMN through_message_id bigint,
    -- The validity end. superseded_by is SET NULL if the successor is deleted, but
    -- superseded_at stays: a row replaced once does not silently become current again.
    ADD COLUMN superseded_at timestamptz,
    ADD COLUMN superseded_by uuid REFERENCES engine.companion_memories (id) ON DELETE SET NULL,
    ADD COLUMN superseded_reason text,
    -- A repeat of a known memory confirms it instead of adding a twin.
    ADD COLUMN last_confirmed_at timestamptz,
    ADD COLUMN mention_count integer NOT NULL DEFAULT 1;

-- Rows written before this migration: utterances carry their message id in metadata; anything
-- else in the profile layer came from dreaming.
UPDATE engine.companion_memories SET
    source = CASE WHEN instance_id IS NOT NULL THEN 'utterance' ELSE coalesce(metadata->>'source', 'dreaming') END,
    from_message_id = CASE WHEN metadata->>'message_id' ~ '^[0-9]{1,18}$' THEN (metadata->>'message_id')::bigint END,
    through_message_id = CASE WHEN metadata->>'message_id' ~ '^[0-9]{1,18}$' THEN (metadata->>'message_id')::bigint
                              WHEN metadata->>'through_message_id' ~ '^[0-9]{1,18}$'
                                   THEN (metadata->>'through_message_id')::bigint END;
UPDATE engine.companion_memories SET source = 'dreaming'
    WHERE source NOT IN ('utterance', 'dreaming', 'deep_pass', 'user');
-- Recall used to skip rows whose metadata named a superseding row; keep them out of recall.
UPDATE engine.companion_memories m SET
    superseded_at = now(),
    superseded_reason = 'changed',
    superseded_by = (SELECT s.id FROM engine.companion_memories s
                     WHERE s.id::text = m.metadata->>'superseded_by' AND s.user_id = m.user_id)
    WHERE m.metadata->>'superseded_by' IS NOT NULL;

ALTER TABLE engine.companion_memories
    ALTER COLUMN source SET NOT NULL,
    ALTER COLUMN source SET DEFAULT 'dreaming',
    ADD CONSTRAINT companion_memories_source_check
        CHECK (source IN ('utterance', 'dreaming', 'deep_pass', 'user')),
    ADD CONSTRAINT companion_memories_supersession_check
        CHECK ((superseded_at IS NULL AND superseded_by IS NULL AND superseded_reason IS NULL)
               OR (superseded_at IS NOT NULL AND superseded_reason IS NOT NULL)),
    ADD CONSTRAINT companion_memories_superseded_reason_check
        CHECK (superseded_reason IN ('changed', 'duplicate', 'reverted', 'edited', 'outdated')),
    ADD CONSTRAINT companion_memories_not_self_superseded CHECK (superseded_by <> id),
    ADD CONSTRAINT companion_memories_mention_count_check CHECK (mention_count >= 1);

-- Recall scans one user's *active* profile rows: the partial index leaves history out, however
-- much of it accumulates.
DROP INDEX engine.companion_memories_profile_idx;
CREATE INDEX companion_memories_profile_idx ON engine.companion_memories (user_id, category)
    WHERE instance_id IS NULL AND superseded_at IS NULL;
-- "Which rows did this one supersede" (the history chain, restore) and the ON DELETE SET NULL of
-- the foreign key: both look rows up by their successor.
CREATE INDEX companion_memories_superseded_by_idx ON engine.companion_memories (superseded_by)
    WHERE superseded_by IS NOT NULL;
-- Write-time consolidation finds the session's own utterances (their vectors) by session and
-- message id.
CREATE INDEX companion_memories_session_messages_idx ON engine.companion_memories (session_id, from_message_id)
    WHERE instance_id IS NOT NULL;

-- The deep pass: one row per user whose memory changed. It is claimed like a session (one
-- UPDATE ... FOR UPDATE SKIP LOCKED; claimed_at is the fencing token every write re-checks;
-- attempts cap a user whose pass keeps failing). changed_at moves whenever dreaming writes or
-- supersedes a profile row; the pass is due while consolidated_at is older than changed_at.
CREATE TABLE engine.user_consolidation (
    user_id         text PRIMARY KEY,
    changed_at      timestamptz NOT NULL DEFAULT now(),
    consolidated_at timestamptz,
    claimed_at      timestamptz,
    attempts        integer NOT NULL DEFAULT 0,
    error           text
);
-- The claim scans only users whose pass is due, in the order their memory changed.
CREATE INDEX user_consolidation_due_idx ON engine.user_consolidation (changed_at)
    WHERE consolidated_at IS NULL OR consolidated_at < changed_at;
