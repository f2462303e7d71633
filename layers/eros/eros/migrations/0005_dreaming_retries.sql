-- 0005 — dreaming's failure policy: whose fault a failure was decides what happens next (issue 8, items 3 and 5).
--
-- Before this, every claim counted an attempt, so a provider outage longer than
-- DREAMING_MAX_ATTEMPTS sweeps gave sessions up for good although nothing was wrong with them.
-- Now three kinds of failure are kept apart:
--   * the session's own (a provider 4xx on this transcript, a crash in our code on it, a worker
--     that died mid-extraction): classification_attempts counts them, DREAMING_MAX_ATTEMPTS caps them;
--   * the world's (provider down, 5xx, 429, timeouts, claims our own backlog let go stale):
--     classification_retries counts them for the backoff only; they are retried for as long as
--     DREAMING_RETRY_WINDOW_SECS, then stamped loudly and left re-drivable;
--   * configuration (401/402/403: a bad key, no credit): counted nowhere; engine.provider_blocks
--     holds the work until a probe gets through.

-- The claim skips a session until this moment (the backoff of its last failure). NULL: now.
ALTER TABLE engine.chat_sessions ADD COLUMN classification_next_attempt_at timestamptz;
-- World-fault failures in a row and when the first of them happened (the retry window's start).
-- Reset by a successful extraction.
ALTER TABLE engine.chat_sessions ADD COLUMN classification_retries integer NOT NULL DEFAULT 0;
ALTER TABLE engine.chat_sessions ADD COLUMN classification_retrying_since timestamptz;
-- The lease (item 5): set once per claim, atomically, by the delivery that starts the work, and
-- re-checked by its write. A duplicate delivery of the same claim finds it set and returns before
-- paying for any provider call. A claim that goes stale with the lease set had a worker that died
-- mid-extraction (counted as the session's attempt: a poison transcript can kill its worker); one
-- without the lease was never started (our backlog: the world's fault, not counted).
ALTER TABLE engine.chat_sessions ADD COLUMN classification_started_at timestamptz;
-- Why a session was stamped without being extracted: 'attempts' (its own fault, capped) or
-- 'retry-window' (the world's: re-drive it with eros.dreaming.redrive once the outage is over).
ALTER TABLE engine.chat_sessions ADD COLUMN classification_gave_up text
    CHECK (classification_gave_up IN ('attempts', 'retry-window'));

-- The sweep counts the claims still in flight (claimed, not stale) to claim no more than the
-- extract function can start before they go stale; claims are few, so this index is small.
CREATE INDEX chat_sessions_claimed_idx ON engine.chat_sessions (classification_claimed_at)
    WHERE classification_claimed_at IS NOT NULL AND classified_at IS NULL;

-- The deep pass, the same way per user.
ALTER TABLE engine.user_consolidation
    ADD COLUMN next_attempt_at timestamptz,
    ADD COLUMN retries integer NOT NULL DEFAULT 0,
    ADD COLUMN retrying_since timestamptz,
    ADD COLUMN started_at timestamptz;
CREATE INDEX user_consolidation_claimed_idx ON engine.user_consolidation (claimed_at) WHERE claimed_at IS NOT NULL;

-- A provider that refused our credentials (401/402/403). One row per provider ('llm', 'embedder').
-- While a row exists the sweep claims nothing but one probe job per DREAMING_CONFIG_PROBE_SECS
-- (no hot loop of refused calls, no attempt counted against any session), /v1/health reports
-- degraded with the reason, and the first provider call that gets through deletes the row.
CREATE TABLE engine.provider_blocks (
    provider      text PRIMARY KEY CHECK (provider IN ('llm', 'embedder')),
    status        integer,
    error         text NOT NULL,  -- the provider's status and our description, never its body
    since         timestamptz NOT NULL,
    next_probe_at timestamptz NOT NULL
);
