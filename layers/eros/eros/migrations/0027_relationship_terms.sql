-- 0027 — the lexical path of recall reads a term's newest rows from a btree, a bounded read at any history size.
--
-- Recall's lexical path (sql/functions/recall.sql: `span`, `rare`, engine.recall_older_v2) finds an old
-- utterance by a word of the message that is rare in the window (a name, a place, a number said long ago).
-- Through migration 0023's GIN index over engine.instance_terms() it read every posting of such a word and then
-- each of those rows from the table, to count its matches and order them by age: a name said once in 500
-- utterances has 200 postings at 100,000 utterances, 200 page reads, ~18 ms of a turn
-- (bench/results/turn_overhead_long_history.md), growing with the history. And "is this word rare in the
-- window" read the window's newest 300 rows from the table (~2.5 ms), because a GIN posting list cannot be
-- read by time.
--
-- engine.relationship_terms holds one row per (active relationship row, lexeme): the lexeme keyed by its instance as
-- engine.instance_terms() keys it (a 64-bit hash of instance and lexeme), the row's created_at, id and user.
-- Its index (term_key, created_at DESC) keeps one persona's rows of a word together, newest first, so
-- * "how many rows of the window hold this word" is a count of at most a dozen index entries, and
-- * "the newest rows older than the window that hold this word" is the first lexical_pool entries of a range,
-- whatever the length of the history. Each index tuple is ~40 bytes, next to the 2 KB of a relationship row.
--
-- It is kept by a trigger, so that every writer of relationship rows (a turn, an extraction's episode, an
-- import, an edit) keeps it without knowing of it, and deleting a row (erasure, a user's delete) deletes its
-- terms: the trigger finds them by (term_key, created_at), the index's own key. A superseded row has none (recall
-- never shows one; a restore gives them back), nor has a profile row (instance_id NULL): the lexical part ranks
-- those among the pool only (recall.sql).
-- Stored data depends on the trigger (the table is what it wrote), so it is versioned here, not in
-- sql/functions (README.md there).
--
-- The GIN index has no reader after this (engine.recall_older_v2, in recall.sql, reads this table), so it goes:
-- one index less to write per utterance. The backfill writes ~12 rows per existing active relationship row
-- (31 s for 316,000 of them in a 1.3M-row table here, with writes to companion_memories held meanwhile). The file
-- can run again: a large database runs it beforehand in one transaction (docs/DEPLOY.md), and the deploy's run of
-- it then changes nothing.
CREATE TABLE IF NOT EXISTS engine.relationship_terms (
    term_key    bigint NOT NULL,       -- engine.instance_terms(instance_id, lexemes): instance and lexeme
    created_at  timestamptz NOT NULL,  -- the memory's
    memory_id   uuid NOT NULL,         -- engine.companion_memories(id) of a relationship row (instance_id set)
    user_id     text NOT NULL          -- the memory's owner, as every table of a user's data carries it
);
CREATE INDEX IF NOT EXISTS relationship_terms_newest_idx
    ON engine.relationship_terms (term_key, created_at DESC) INCLUDE (memory_id, user_id);

CREATE OR REPLACE FUNCTION engine.keep_relationship_terms() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.instance_id IS NOT NULL AND OLD.superseded_at IS NULL THEN
        DELETE FROM engine.relationship_terms t
        WHERE t.term_key = ANY (engine.instance_terms(OLD.instance_id, OLD.lexemes))
          AND t.created_at = OLD.created_at AND t.memory_id = OLD.id AND t.user_id = OLD.user_id;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.instance_id IS NOT NULL AND NEW.superseded_at IS NULL THEN
        INSERT INTO engine.relationship_terms (term_key, created_at, memory_id, user_id)
        SELECT k, NEW.created_at, NEW.id, NEW.user_id
        FROM unnest(engine.instance_terms(NEW.instance_id, NEW.lexemes)) AS k;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER companion_memories_keep_relationship_terms
    AFTER INSERT OR DELETE ON engine.companion_memories
    FOR EACH ROW EXECUTE FUNCTION engine.keep_relationship_terms();
CREATE OR REPLACE TRIGGER companion_memories_keep_relationship_terms_on_change
    AFTER UPDATE ON engine.companion_memories
    FOR EACH ROW
    WHEN (OLD.lexemes IS DISTINCT FROM NEW.lexemes OR OLD.instance_id IS DISTINCT FROM NEW.instance_id
          OR OLD.created_at IS DISTINCT FROM NEW.created_at OR OLD.user_id IS DISTINCT FROM NEW.user_id
          OR (OLD.superseded_at IS NULL) <> (NEW.superseded_at IS NULL))
    EXECUTE FUNCTION engine.keep_relationship_terms();

INSERT INTO engine.relationship_terms (term_key, created_at, memory_id, user_id)
SELECT k, m.created_at, m.id, m.user_id
FROM engine.companion_memories m, unnest(engine.instance_terms(m.instance_id, m.lexemes)) AS k
WHERE m.instance_id IS NOT NULL AND m.superseded_at IS NULL
  AND NOT EXISTS (SELECT FROM engine.relationship_terms);  -- run beforehand (docs/DEPLOY.md): done already

DROP INDEX IF EXISTS engine.companion_memories_instance_terms_idx;
