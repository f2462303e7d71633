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
