-- 0017 — one fact, one current version, always (issue 25).
--
-- The invariant: a version chain has at most one active row. A *version chain* is the set of profile rows that
-- are versions of one fact: a row and everything that ever superseded it or that it superseded as a changed
-- fact, an edit, a revert or a merged duplicate. Until now the chain was only implied by the superseded_by
-- links, and those break: deleting a middle version sets its predecessor's superseded_by to NULL (the foreign
-- key of 0004), so v0 <- v1 <- v2 with v1 deleted left v0 with no way to reach v2, and restoring v0 made both
-- current. A restore racing an edit did the same: it looked for the head, the edit replaced the head
-- meanwhile, and the restore retired nothing.
--
-- So the chain is a column now, and the database enforces the invariant:
-- * chain_id names the chain; NULL means "a chain of its own", whose name is the row's id (coalesce(chain_id,
--   id)), so the rows nobody versions (most of them, and every relationship-layer row) carry nothing and
--   inserting one is unchanged. A name is only a label: it may be the id of a row deleted since, and it
--   survives any deletion, which is the point.
-- * The database keeps the chains: a row that gets a successor (superseded_by set, whoever sets it) joins the
--   successor's chain, both chains becoming one (engine.join_version_chains below). A deleted row's
--   neighbours stay in their chain.
-- * Every change to a chain is made in one transaction that holds the user's memory lock (eros.store.
--   consolidation.hold_user), so it sees the chain as it is: a restore retires whatever version of its chain
--   is active, never "the head it found by walking", and restoring a merged duplicate takes it (and the
--   versions it had before the merge) out into a chain of its own, since the user says it was not the same
--   fact (eros.store.memories.restore_memory).
-- * companion_memories_one_current_version makes a second active row in a chain an error rather than a state.
--   It is a plain unique index, checked row by row, so every writer retires the old version before the other
--   one becomes active (a restore retires the head first, then reactivates).
-- Relationship-layer rows are not versions of each other (an utterance that a changed fact outdated names that
-- fact's row in superseded_by, reason 'outdated'): they never carry a chain_id.

ALTER TABLE engine.companion_memories
    ADD COLUMN chain_id uuid,
    ADD CONSTRAINT companion_memories_chain_profile_check CHECK (chain_id IS NULL OR instance_id IS NULL);

-- Rows written before: a row's chain is named after where its superseded_by links lead (the active version,
-- or the last version before a deleted one). Every active row ends its own walk, so no chain gets two of them
-- here; chains already broken by a deletion stay apart (nothing records that they were one).
WITH RECURSIVE walk(id, user_id, at, depth) AS (
    SELECT id, user_id, id, 0 FROM engine.companion_memories WHERE instance_id IS NULL
  UNION ALL
    SELECT w.id, w.user_id, s.id, w.depth + 1
    FROM walk w
    JOIN engine.companion_memories cur ON cur.id = w.at
    JOIN engine.companion_memories s ON s.id = cur.superseded_by AND s.user_id = w.user_id
         AND s.instance_id IS NULL
    WHERE w.depth < 100
), ends AS (
    SELECT DISTINCT ON (id) id, at FROM walk ORDER BY id, depth DESC
)
UPDATE engine.companion_memories m SET chain_id = ends.at
FROM ends WHERE m.id = ends.id AND ends.at <> m.id;

-- The chain's members, by its name: the rows that carry it here, and the row whose own id it is (when it still
-- has a NULL chain_id) by the primary key. Only rows that are versions of something are in this index.
CREATE INDEX companion_memories_chain_idx ON engine.companion_memories (user_id, chain_id)
    WHERE chain_id IS NOT NULL;
-- The invariant.
CREATE UNIQUE INDEX companion_memories_one_current_version
    ON engine.companion_memories (user_id, (coalesce(chain_id, id)))
    WHERE instance_id IS NULL AND superseded_at IS NULL;

-- The current definition, and what it does and why: eros/sql/functions/chains.sql.
CREATE FUNCTION engine.join_version_chains() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    retired uuid;  -- the retired row's chain as it is now (an earlier row of the same statement may have moved it)
    joining uuid;  -- the successor's
BEGIN
    SELECT coalesce(m.chain_id, m.id) INTO retired FROM engine.companion_memories m
    WHERE m.id = NEW.id AND m.user_id = NEW.user_id;
    SELECT coalesce(s.chain_id, s.id) INTO joining FROM engine.companion_memories s
    WHERE s.id = NEW.superseded_by AND s.user_id = NEW.user_id AND s.instance_id IS NULL;
    IF retired IS NOT NULL AND joining IS NOT NULL AND retired <> joining THEN
        UPDATE engine.companion_memories m SET chain_id = retired
        WHERE m.user_id = NEW.user_id AND m.instance_id IS NULL
          AND (m.chain_id = joining OR (m.id = joining AND m.chain_id IS NULL));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER companion_memories_join_version_chains
    AFTER UPDATE OF superseded_by ON engine.companion_memories
    FOR EACH ROW
    WHEN (NEW.superseded_by IS NOT NULL AND NEW.superseded_by IS DISTINCT FROM OLD.superseded_by
          AND NEW.instance_id IS NULL)
    EXECUTE FUNCTION engine.join_version_chains();
-- The current definition, and what it does and why: eros/sql/functions/chains.sql.
CREATE TRIGGER companion_memories_join_version_chains_on_insert
    AFTER INSERT ON engine.companion_memories
    FOR EACH ROW
    WHEN (NEW.superseded_by IS NOT NULL AND NEW.instance_id IS NULL)
    EXECUTE FUNCTION engine.join_version_chains();
