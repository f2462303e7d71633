-- 0003 — keep memory rows (and their vectors) in the main heap, and list a user's memories by index.

-- A vector(512) is 2,052 bytes, just over the ~2 KB row size at which Postgres moves wide values
-- out of line (TOAST). Every recalled row then cost extra page reads from the TOAST table
-- (measured by bench/turn_overhead.py: 603 -> 103 buffers for one user's profile recall, turn
-- p95 about 15 -> 13 ms). A higher target keeps rows up to ~8 KB inline.
-- Existing rows move only when rewritten: on a database that already holds memories, run
-- `VACUUM FULL engine.companion_memories` (or pg_repack) once, off-peak. It cannot run here:
-- a migration is one transaction.
ALTER TABLE engine.companion_memories SET (toast_tuple_target = 8160);

-- GET /v1/memories lists one user's rows newest first across both layers; without this index
-- it scanned the whole table (90-120 ms at a million rows).
CREATE INDEX companion_memories_user_listing_idx
    ON engine.companion_memories (user_id, created_at DESC, id DESC);
