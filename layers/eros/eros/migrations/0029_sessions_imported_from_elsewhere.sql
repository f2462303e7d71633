-- 0029 — a session can name the conversation it was imported from (issue 28, `eros import`).
--
-- An app's existing history comes in as a file of conversations, each with the app's own id. Importing the same
-- file again, or the rest of it after a failure, must find the session it made for a conversation instead of
-- making a second: so the session keeps that id, unique per user. A session started by a client has none.
-- The unique index names user_id first, as every unique key of a user's table does (tests/test_shard_ready.py).
ALTER TABLE engine.chat_sessions ADD COLUMN IF NOT EXISTS external_id text
    CHECK (length(external_id) BETWEEN 1 AND 200);
CREATE UNIQUE INDEX IF NOT EXISTS chat_sessions_external_idx
    ON engine.chat_sessions (user_id, external_id) WHERE external_id IS NOT NULL;
