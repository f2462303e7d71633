-- 0023 — what a bounded recall reads (issue 27): each memory's sign bits, and an index of each persona
-- instance's words.
--
-- A turn's recall was an exact scan of every row the user has in both layers, and the relationship layer grows
-- by one utterance a turn (~15 µs a row: 1.45 s at 100,000). engine.recall_layer_v2 (sql/functions/recall.sql)
-- reads a bounded candidate set instead; this migration adds what it reads:
--
-- * `signs`, bit(512): the sign of each of the embedding's 512 dimensions (1 where it is > 0). Hamming distance
--   between two rows' signs, bit_count(a # b), is a cheap estimate of their angle; recall ranks a large set by it
--   first (64 bytes a row instead of the 2 KB vector, a popcount instead of 512 multiplications) and re-ranks only
--   the best few hundred exactly. pgvector 0.6 (the embedded Postgres) has no binary_quantize() and the stock
--   bit type needs no extension, so the bits are made here: engine.embedding_signs(), versioned in the
--   migrations because stored data depends on it (sql/functions/README.md, "What may not go here").
--   A plain column filled by a trigger, not a STORED generated column: adding a generated column rewrites the
--   whole table under an ACCESS EXCLUSIVE lock (migration 0012 measured 3.5 minutes for 1.2M rows, every turn
--   waiting), while ADD COLUMN without a default is a catalog change. The existing rows are filled by the UPDATE
--   below, which locks only the rows (turns keep inserting; an extraction's supersede of an old row waits for
--   the commit). Measured on the bench's 1.2M rows: docs/CAPACITY.md ("Bounded recall: deploying it"), which
--   also gives the batched, by-hand way for a database too large for one transaction; every statement here is
--   written so that it is a no-op where that was done first. A row whose signs are still NULL is never lost:
--   recall counts it at Hamming distance 0 (always re-ranked exactly).
-- * `companion_memories_instance_terms_idx`: a GIN index over engine.instance_terms(), each relationship row's
--   lexemes keyed by its instance (a hash of instance and lexeme), so that the lexical path of recall finds an
--   old utterance by a name, place or number in the rows of one persona instance, at a cost that follows that
--   instance's matches, not every user's rows that share the word (a plain GIN over `lexemes` would read the
--   global posting list; btree_gin, which could pair the instance with the lexemes, is not among the embedded
--   Postgres's extensions). A hash collision only adds a row that recall's own match test then drops.
-- * `companion_memories_episodes_idx`: the active episodes of an instance (migration 0021), which recall
--   prefilters by their signs; INCLUDE (signs) lets that read be an index-only scan.
CREATE OR REPLACE FUNCTION engine.embedding_signs(embedding vector) RETURNS bit(512)
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
RETURN (SELECT string_agg(CASE WHEN x > 0 THEN '1' ELSE '0' END, '' ORDER BY i)
        FROM unnest(embedding::real[]) WITH ORDINALITY AS d(x, i))::bit(512);

CREATE OR REPLACE FUNCTION engine.instance_terms(instance_id uuid, lexemes tsvector) RETURNS bigint[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
RETURN ARRAY(SELECT hashtextextended(instance_id::text || ' ' || lexeme, 0)
             FROM unnest(tsvector_to_array(lexemes)) AS lexeme);

CREATE OR REPLACE FUNCTION engine.fill_signs() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    NEW.signs := engine.embedding_signs(NEW.embedding);
    RETURN NEW;
END
$$;

ALTER TABLE engine.companion_memories ADD COLUMN IF NOT EXISTS signs bit(512);

CREATE OR REPLACE TRIGGER companion_memories_fill_signs
    BEFORE INSERT OR UPDATE OF embedding ON engine.companion_memories
    FOR EACH ROW EXECUTE FUNCTION engine.fill_signs();

UPDATE engine.companion_memories SET signs = engine.embedding_signs(embedding) WHERE signs IS NULL;

CREATE INDEX IF NOT EXISTS companion_memories_instance_terms_idx
    ON engine.companion_memories USING gin (engine.instance_terms(instance_id, lexemes))
    WHERE instance_id IS NOT NULL;

CREATE INDEX IF NOT EXISTS companion_memories_episodes_idx
    ON engine.companion_memories (instance_id, created_at) INCLUDE (signs)
    WHERE source = 'episode' AND superseded_at IS NULL;
