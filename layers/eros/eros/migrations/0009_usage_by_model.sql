-- 0009 — what each provider call cost, by purpose and model (issue 11, "usage and cost").
--
-- 0007's engine.user_usage counts a user's tokens per UTC day: the one number the daily budget and the
-- turn admission check, atomically, on one row. It cannot say what the tokens were spent on or which
-- model they went to, so it cannot be priced (models differ by 100x, and input and output tokens are
-- priced apart). This table itemises the same calls: one row per user, day, purpose and model, written by
-- the same statement that adds to user_usage (eros.store.usage.spending), so the two never disagree. It is
-- accounting only: the budget still reads user_usage's single row, so admission costs no more than before.
--
-- Purposes are why the call was made: 'chat' (a turn's reply and its query embedding), 'extraction'
-- (distilling a session, and embedding what it wrote), 'deep_pass' (consolidating a user's memory across
-- sessions) and 'curation' (the memory API's search, add and edit embeddings). Prices are not stored:
-- a report turns tokens into an estimated cost with the price table of the settings (MODEL_PRICES).
CREATE TABLE engine.user_model_usage (
    user_id       text NOT NULL,
    day           date NOT NULL,  -- UTC, as user_usage
    purpose       text NOT NULL CHECK (purpose IN ('chat', 'extraction', 'deep_pass', 'curation')),
    model         text NOT NULL,  -- the name the provider answered with (or the one asked for)
    calls         integer NOT NULL DEFAULT 0,  -- provider calls, also those that reported no tokens
    input_tokens  bigint NOT NULL DEFAULT 0,  -- prompt tokens; an embedding's tokens are all input
    output_tokens bigint NOT NULL DEFAULT 0,  -- completion tokens
    PRIMARY KEY (user_id, day, purpose, model)
);
-- An operator's report (eros usage) reads a range of days across users.
CREATE INDEX user_model_usage_day_idx ON engine.user_model_usage (day);

-- eros_app gets its rights on this table from 0006's default privileges (and eros.migrate's re-grant).
