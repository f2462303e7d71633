-- 0026 — the unique index that keeps one episode per session is keyed (session_id, user_id), not (user_id,
-- session_id).
--
-- Recall reads a persona's newest episodes (sql/functions/recall.sql, `episodes`) by user, instance and time,
-- through companion_memories_episodes_recall_idx (instance_id, created_at), in time order, index-only. The plan a
-- turn keeps is made without the values (turn_recall_v2 forces the generic plan), and to such a plan the user's
-- condition alone looked as selective as the user's and instance's together: it read the episodes through
-- 0024's (user_id, session_id) index, the smaller one, every episode of the user from the table and then sorted
-- them (5,000 episodes at 100,000 utterances: ~11 ms of a turn, bench/results/turn_overhead_long_history.md).
-- Keyed by the session first, this index answers only what it is for -- "this session's episode" (the
-- extraction's rewrite of it) and the uniqueness -- and still names the user, as every unique key must once the
-- table is partitioned by user (tests/partitioning.py). Episodes only (one row per session): quick to build.
DROP INDEX engine.companion_memories_one_episode_per_session;
CREATE UNIQUE INDEX companion_memories_one_episode_per_session
    ON engine.companion_memories (session_id, user_id) WHERE source = 'episode';
