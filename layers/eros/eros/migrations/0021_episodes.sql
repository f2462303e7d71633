-- 0021 — episodes: what happened in a session, remembered by the persona (issue 27).
--
-- The relationship layer held only utterances (one row per user message, its own words). Dreaming now also
-- writes one episode per session into that layer: a short account, in the persona's memory voice, of what
-- happened between the user and the persona in that session, with the session's event time. An episode is a
-- companion_memories row like any other (so listing, export, erasure and recall reach it without new paths):
--
-- * source 'episode'; instance_id set (the persona it happened with) and no category, as every relationship row.
-- * Provenance as every row dreaming writes: session_id, the message range (from_message_id ..
--   through_message_id) it was written from, and metadata.model, the model that wrote it.
-- * At most one episode per session: a resumed session's extraction rewrites its episode (the model is shown
--   the one it wrote before) instead of adding a second. The unique index makes a duplicate an error, not a
--   state, even under two racing extractions of one session (the claim already prevents those).
--   (session_id may become NULL later, as any row's: a deleted session leaves its memories.)
ALTER TABLE engine.companion_memories
    DROP CONSTRAINT companion_memories_source_check,
    ADD CONSTRAINT companion_memories_source_check
        CHECK (source IN ('utterance', 'dreaming', 'deep_pass', 'user', 'episode')),
    ADD CONSTRAINT companion_memories_episode_check
        CHECK (source <> 'episode' OR (instance_id IS NOT NULL AND category IS NULL));

CREATE UNIQUE INDEX companion_memories_one_episode_per_session
    ON engine.companion_memories (session_id) WHERE source = 'episode';
