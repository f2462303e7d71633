-- 0025 — recall reads its candidates from indexes that carry their vectors (issue 27).
--
-- Recall (sql/functions/recall.sql, engine.recall_layer_v2) scores every candidate exactly (the profile, the
-- window of newest utterances, the newest episodes) from its distance, event time and importance, and reads a
-- row's text and lexemes only for the few dozen best. Migration 0023's first form picked those by a sign-bit
-- estimate of the cosine and then read 400 rows per layer from the table: each row is a page of its own once a
-- conversation has run for a while (rows of all users are appended in one heap), so 400 rows were 400 page reads,
-- and on e5 vectors the estimate kept only 86 % of the exact top 10 (bench/results/recall_prefilter.md).
-- A btree index keeps one user's (one persona's) rows together, in key order; so these three replace the ones
-- recall used, with the same keys and conditions, and INCLUDE what recall reads, the vector too:
--
-- * companion_memories_profile_recall_idx replaces companion_memories_profile_idx (user_id, category);
-- * companion_memories_relationship_recall_idx replaces companion_memories_relationship_idx (instance_id,
--   created_at), read backwards for the window;
-- * companion_memories_episodes_recall_idx replaces 0024's companion_memories_episodes_idx.
--
-- The cost is a second copy of each vector (2 KB) in the first two indexes: storage for the vectors doubles
-- (docs/CAPACITY.md), and a write puts the vector in the index as well as the table. An index tuple may hold at
-- most ~2.7 KB, and a vector(512) is 2,056 bytes: the included columns fit with room to spare, and a wider
-- embedding is a change of the column (and of these indexes) anyway.
--
-- Building them reads the whole table once and holds writes to it meanwhile (minutes per million rows): a
-- deployment with a large table runs this migration in a quiet hour (docs/DEPLOY.md).
CREATE INDEX IF NOT EXISTS companion_memories_profile_recall_idx
    ON engine.companion_memories (user_id, category)
    INCLUDE (id, importance, created_at, occurred_at, embedding)
    WHERE instance_id IS NULL AND superseded_at IS NULL;
DROP INDEX IF EXISTS engine.companion_memories_profile_idx;

CREATE INDEX IF NOT EXISTS companion_memories_relationship_recall_idx
    ON engine.companion_memories (instance_id, created_at)
    INCLUDE (user_id, id, source, superseded_at, importance, occurred_at, embedding)
    WHERE instance_id IS NOT NULL;
DROP INDEX IF EXISTS engine.companion_memories_relationship_idx;

CREATE INDEX IF NOT EXISTS companion_memories_episodes_recall_idx
    ON engine.companion_memories (instance_id, created_at)
    INCLUDE (user_id, id, importance, occurred_at, embedding)
    WHERE source = 'episode' AND superseded_at IS NULL;
DROP INDEX IF EXISTS engine.companion_memories_episodes_idx;
