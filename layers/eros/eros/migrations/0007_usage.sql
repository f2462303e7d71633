-- 0007 — spend limits (issue 8, item 10): a per-user turn rate and a per-user daily token budget.
--
-- Before this, any token holder could drive unbounded LLM cost. One row per user per UTC day holds
-- what that user spent (tokens of every provider call: chat turns, extraction, the deep pass and
-- their embeddings) and the user's current rate window. It lives in Postgres rather than in a
-- function's memory because Lambda runs many containers: only the database sees all of a user's
-- requests. Every change is one atomic statement (INSERT .. ON CONFLICT DO UPDATE .. WHERE, which
-- locks the row and re-checks the limit on its latest version), so concurrent turns of one user
-- cannot both pass a limit that only one of them fits under: no read-then-write race.
CREATE TABLE engine.user_usage (
    user_id      text NOT NULL,
    day          date NOT NULL,  -- UTC; a new day is a new row, so the budget resets at midnight UTC
    tokens       bigint NOT NULL DEFAULT 0,  -- all provider tokens of the day (what the budget bounds)
    chat_tokens  bigint NOT NULL DEFAULT 0,  -- of which: chat turns (model + query embedding)
    dream_tokens bigint NOT NULL DEFAULT 0,  -- of which: extraction and the deep pass (LLM + embeddings)
    turns        integer NOT NULL DEFAULT 0,  -- turns admitted
    -- The rate window: a fixed one-minute window (its start) and the turns admitted in it.
    window_start timestamptz,
    window_turns integer NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, day)
);
-- Old days are history only; this index lets a retention job delete them cheaply.
CREATE INDEX user_usage_day_idx ON engine.user_usage (day);

-- eros_app gets its rights on this table from 0006's default privileges (and eros.migrate's re-grant).
