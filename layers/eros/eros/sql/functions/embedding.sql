-- The embedding space's guard (current definition; README.md here says how this file is applied): the table
-- engine.embedding_space (migration 0032, which says why it is one row per deployment) learns the model of the
-- first vector written, and no vector whose metadata names another model is written after it, whatever path writes
-- it (the turn's functions of turn.sql, the stores of eros/store); once no vector of the recorded model is left,
-- the next model written is recorded instead. A cosine between vectors of two models means
-- nothing; eros.calibrated.guard refuses such an embedder before it is paid, this is the net under it. Rows whose
-- metadata names no model (hand-seeded ones) are not checked. SQLSTATE EM001: eros.calibrated names both models.
CREATE OR REPLACE FUNCTION engine.keep_embedding_space() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    written text := NEW.metadata->>'embed_model';
    recorded text;
BEGIN
    IF written IS NULL OR written = '' THEN
        RETURN NEW;
    END IF;
    SELECT model INTO recorded FROM engine.embedding_space;
    IF recorded IS NULL THEN
        INSERT INTO engine.embedding_space (model, dimension) VALUES (written, vector_dims(NEW.embedding))
        ON CONFLICT DO NOTHING;
        SELECT model INTO recorded FROM engine.embedding_space;
    END IF;
    IF recorded <> written AND NOT EXISTS (SELECT 1 FROM engine.companion_memories m
                                           WHERE m.metadata->>'embed_model' = recorded AND m.id <> NEW.id) THEN
        -- No vector of the recorded model is left (erased, or a test's rows deleted): nothing to mix with.
        UPDATE engine.embedding_space
        SET model = written, dimension = vector_dims(NEW.embedding), recorded_at = now();
    ELSIF recorded <> written THEN
        RAISE EXCEPTION 'the stored vectors were embedded by %, not by % (the configured embedder): vectors of two'
                        ' models cannot be compared', recorded, written
            USING ERRCODE = 'EM001', HINT = 'set EMBED_MODEL back to the recorded model; eros doctor says more';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER companion_memories_keep_embedding_space
    BEFORE INSERT OR UPDATE OF embedding ON engine.companion_memories
    FOR EACH ROW EXECUTE FUNCTION engine.keep_embedding_space();

-- A read's guard (store.recall.ranked, a memory search; engine.turn_recall_v3, a turn's recall): its query vector was
-- embedded by ``model``; true when that is the recorded model (or none is recorded yet, or no vector of it is left),
-- else SQLSTATE EM001, as for a write. A container learns of a
-- re-embedding's switch within a second (eros.calibrated); a search it embedded with the old model in that second
-- is refused (a retryable 503) rather than compared with the new model's vectors. In a WHERE clause with no column
-- of the rows it is evaluated once, before any row is read.
CREATE OR REPLACE FUNCTION engine.embedded_with(model text) RETURNS boolean
    LANGUAGE plpgsql STABLE
AS $$
DECLARE
    recorded text;
BEGIN
    SELECT s.model INTO recorded FROM engine.embedding_space s;
    -- As the write's guard: no vector of the recorded model left (erased, a test's rows deleted) is nothing to mix.
    IF model IS NOT NULL AND recorded IS NOT NULL AND recorded <> model
       AND EXISTS (SELECT 1 FROM engine.companion_memories m WHERE m.metadata->>'embed_model' = recorded) THEN
        RAISE EXCEPTION 'the query was embedded by %, but the stored vectors are of %: vectors of two models cannot'
                        ' be compared', model, recorded
            USING ERRCODE = 'EM001', HINT = 'retry: the embedding model was switched while the request ran';
    END IF;
    RETURN true;
END
$$;
