-- 0032 — which model embedded the stored vectors, and the similarity thresholds calibrated per model (issue 30).
--
-- Every threshold the engine compares a cosine with is on one embedding model's scale (eros.calibration), and a
-- cosine between vectors of two models means nothing. So the deployment records the model its vectors come from,
-- and a configured embedder of another model is refused before it compares (eros.calibrated.guard) or writes (the
-- trigger of eros/sql/functions/embedding.sql) anything.
--
-- engine.embedding_space: ONE row per deployment, not a column on every vector row. Why:
-- * A deployment embeds with one model (EMBED_MODEL is one setting); every comparison is between vectors of that
--   deployment, so one row says what a column would repeat on every row.
-- * companion_memories is the hottest table, and its covering indexes (migration 0025) carry rows of about 2.7 KB:
--   a model name on each row would widen them, or need a rewrite of every row to backfill, for a value that is
--   the same on all of them. Each row still names its model in metadata.embed_model (written since migration
--   0001's callers), which is what the backfill below and a later re-embedding job read.
-- * The guard: a trigger (engine.keep_embedding_space, eros/sql/functions/embedding.sql) records the model of the first vector written (an empty deployment learns it from its
--   first write) and refuses any later vector whose metadata names another model, on every write path (the turn's
--   SQL functions included), so a mixed table cannot come about by a path the Python check missed. Rows whose
--   metadata names no model (hand-seeded ones) are not checked.
-- A change of embedder is a re-embedding of every row (a later dreaming job kind), which moves this row to the
-- new model when it is done; until then the engine refuses the new model rather than mix the two.
CREATE TABLE IF NOT EXISTS engine.embedding_space (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    model       text NOT NULL CHECK (length(model) BETWEEN 1 AND 200),
    dimension   int NOT NULL CHECK (dimension BETWEEN 1 AND 16000),
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- An existing deployment: the model of its newest vector, if its rows name one (rows of other models already
-- stored, as in a local stack that ran offline before a key was set, are counted by `eros doctor`).
INSERT INTO engine.embedding_space (model, dimension)
SELECT m.metadata->>'embed_model', vector_dims(m.embedding)
FROM engine.companion_memories m
WHERE m.metadata ? 'embed_model' AND length(m.metadata->>'embed_model') BETWEEN 1 AND 200
ORDER BY m.created_at DESC
LIMIT 1
ON CONFLICT DO NOTHING;

-- The thresholds and score weights `eros calibrate` derived for a model from the deployment's own memories
-- (eros.calibration.calibrate); the newest row of a model is the one used (eros.calibrated), below an explicit
-- environment variable and above the calibrations the code ships. Rows are kept: they are the history of what
-- was chosen. The ranges are the ones eros.config.RecallKnobs accepts for the same knobs.
CREATE TABLE IF NOT EXISTS engine.embedding_calibrations (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    model                text NOT NULL CHECK (length(model) BETWEEN 1 AND 200),
    dimension            int NOT NULL CHECK (dimension BETWEEN 1 AND 16000),
    dedupe_similarity    float8 NOT NULL CHECK (dedupe_similarity > 0 AND dedupe_similarity <= 1),
    demote_similarity    float8 NOT NULL CHECK (demote_similarity > 0 AND demote_similarity <= 2),
    deep_pass_similarity float8 NOT NULL CHECK (deep_pass_similarity > 0 AND deep_pass_similarity <= 1),
    lexical_weight       float8 NOT NULL CHECK (lexical_weight >= 0 AND lexical_weight <= 1),
    importance_weight    float8 NOT NULL CHECK (importance_weight >= 0 AND importance_weight <= 1),
    source               text NOT NULL CHECK (length(source) BETWEEN 1 AND 200),
    sample               int NOT NULL CHECK (sample >= 0),
    created_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS embedding_calibrations_model_idx ON engine.embedding_calibrations (model, id DESC);
