-- 0033 — a change of embedder is a re-embedding, a dreaming job kind (issue 30).
--
-- Migration 0032 records the model the stored vectors came from (engine.embedding_space) and refuses vectors of
-- another. When EMBED_MODEL names another model, the sweep starts a re-embedding (eros.dreaming.reembedding):
--
-- * engine.embedding_space.next_model: the model every row is being re-embedded with. Until the switch, the engine
--   goes on embedding queries and new rows with the recorded model (eros.calibrated.embedder), so recall keeps
--   working and never compares vectors of two models.
-- * companion_memories.embedding_next: a row's vector of next_model, written beside ``embedding`` (a nullable
--   column: adding it rewrites nothing). Nothing reads it but the switch.
-- * engine.user_reembedding: one job per user whose rows are re-embedded, claimed, leased and retried like a deep
--   pass (store.claims: the lifecycle columns without a prefix). ``rows_done`` is its progress.
-- * The switch (store.reembedding.switch), once no user's job is pending and no row lacks its next vector: ONE
--   transaction moves embedding_space to next_model and every row's embedding_next into embedding, so every
--   comparison before it is of the old model's vectors and every one after it of the new model's.
ALTER TABLE engine.companion_memories ADD COLUMN IF NOT EXISTS embedding_next vector(512);

ALTER TABLE engine.embedding_space
    ADD COLUMN IF NOT EXISTS next_model     text CHECK (length(next_model) BETWEEN 1 AND 200),
    ADD COLUMN IF NOT EXISTS next_dimension int CHECK (next_dimension BETWEEN 1 AND 16000),
    ADD COLUMN IF NOT EXISTS next_since     timestamptz;

CREATE TABLE IF NOT EXISTS engine.user_reembedding (
    user_id         text PRIMARY KEY,
    model           text NOT NULL CHECK (length(model) BETWEEN 1 AND 200),
    queued_at       timestamptz NOT NULL DEFAULT now(),
    rows_done       int NOT NULL DEFAULT 0 CHECK (rows_done >= 0),
    done_at         timestamptz,
    claimed_at      timestamptz,
    started_at      timestamptz,
    attempts        int NOT NULL DEFAULT 0,
    retries         int NOT NULL DEFAULT 0,
    retrying_since  timestamptz,
    error           text,
    next_attempt_at timestamptz
);
-- The claim's scan: the jobs not done yet, oldest first.
CREATE INDEX IF NOT EXISTS user_reembedding_pending_idx ON engine.user_reembedding (queued_at) WHERE done_at IS NULL;

-- What a re-embedding's provider calls cost is counted like the rest, under a purpose of its own.
ALTER TABLE engine.user_model_usage DROP CONSTRAINT IF EXISTS user_model_usage_purpose_check;
ALTER TABLE engine.user_model_usage ADD CONSTRAINT user_model_usage_purpose_check
    CHECK (purpose IN ('chat', 'extraction', 'deep_pass', 'curation', 'reembedding'));
