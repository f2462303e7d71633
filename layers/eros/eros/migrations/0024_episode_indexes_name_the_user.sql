-- 0024 — the two episode indexes as they must be (0021 and 0023 are kept exactly as first committed: a migration
-- is history, and a database migrated with them keeps their text, so the correction is a migration of its own).
--
-- * companion_memories_one_episode_per_session: (user_id, session_id), not (session_id). A session is one user's,
--   so this is still "one episode per session", and it names the user as every unique key must once the table
--   is partitioned by user (tests/partitioning.py; test_partitioned_by_user caught the first form).
-- * companion_memories_episodes_idx: INCLUDE (user_id, id, signs), not (signs), so that recall's read of an
--   instance's episodes (the sign-bit prefilter, sql/functions/recall.sql) is an index-only scan that also
--   carries the row's key and owner: 5,000 episodes at 100,000 utterances are index tuples of ~100 bytes each,
--   not 2.7 KB heap rows.
-- Both indexes are small (episodes only: one row per session), so rebuilding them here is quick.
DROP INDEX engine.companion_memories_one_episode_per_session;
CREATE UNIQUE INDEX companion_memories_one_episode_per_session
    ON engine.companion_memories (user_id, session_id) WHERE source = 'episode';

DROP INDEX engine.companion_memories_episodes_idx;
CREATE INDEX companion_memories_episodes_idx
    ON engine.companion_memories (instance_id, created_at) INCLUDE (user_id, id, signs)
    WHERE source = 'episode' AND superseded_at IS NULL;
