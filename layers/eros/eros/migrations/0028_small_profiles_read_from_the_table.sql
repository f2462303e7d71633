-- 0028 — a slim index of each user's current profile rows, so that recall reads a small profile from the table.
--
-- Since migration 0025 recall scores the profile from companion_memories_profile_recall_idx, which carries each
-- row's vector: for a large profile (2,000 rows) that keeps a user's rows together, where the table has them a page
-- each. For most users the profile is small (~100 rows with consolidation), and their rows are a page each in the
-- covering index too; reading it there and then the best few dozen rows again from the table kept both copies of a
-- random small user's vectors competing for memory, and made the small user's turn slower than before 0025
-- (bench/results/turn_overhead.md notes: median x1.12 at p50, x1.29 at p95). So recall (sql/functions/recall.sql,
-- `sized`) first reads the ids of the user's current categorised profile rows from this index, at most 301 of
-- them: up to 300 it reads those rows from the table by key, as before 0025, and only a larger profile goes
-- through the covering index. ~40 bytes a profile row.
CREATE INDEX IF NOT EXISTS companion_memories_profile_ids_idx
    ON engine.companion_memories (user_id) INCLUDE (id)
    WHERE instance_id IS NULL AND superseded_at IS NULL AND category IS NOT NULL;
