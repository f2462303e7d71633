-- 0037 — signed webhooks (issue 32): an app's memory events, delivered to its own HTTPS endpoint as well as to the
-- deployment's bus (eros.webhooks; docs/EVENTS.md "Webhooks").
--
-- An app has at most one endpoint. ``secret`` is kept as it is, not hashed as an API key is (migration 0036): the
-- engine signs every delivery with it (an HMAC needs the key itself), so a hash would be of no use. It is shown to
-- the operator once, when it is made or rotated; the API and the logs never show it again.
CREATE TABLE IF NOT EXISTS engine.app_webhooks (
    app_id            text PRIMARY KEY REFERENCES engine.apps (id) ON DELETE CASCADE,
    url               text NOT NULL CHECK (length(url) BETWEEN 1 AND 2000),
    secret            text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    secret_rotated_at timestamptz
);

-- One row per event per app with an endpoint, written in the transaction that drains the event from the outbox
-- (eros.events.publish_pending): exactly once, as the event itself. ``payload`` is the envelope as published (with
-- the memory's text only when the app or the deployment opted in): a user's data, so the row carries the user key
-- and goes with the user's erasure and with the app's deletion. A delivery is due at ``next_attempt_at``; a sweep
-- that takes it pushes that forward by a lease (so a concurrent sweep leaves it), then sets ``delivered_at``, or
-- a later ``next_attempt_at`` (backoff), or, past the last attempt, ``dead_at``: the dead letters, kept until an
-- operator redrives them or the app or user is erased.
CREATE TABLE IF NOT EXISTS engine.webhook_deliveries (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    app_id          text NOT NULL REFERENCES engine.apps (id) ON DELETE CASCADE,
    user_id         text NOT NULL,
    event_id        bigint NOT NULL,
    seq             bigint NOT NULL,
    payload         jsonb NOT NULL,
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_status     integer,
    last_error      text,
    delivered_at    timestamptz,
    dead_at         timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (app_id, event_id)
);
-- The sweep's claim: the due ones, oldest first.
CREATE INDEX IF NOT EXISTS webhook_deliveries_due_idx ON engine.webhook_deliveries (next_attempt_at, id)
    WHERE delivered_at IS NULL AND dead_at IS NULL;
CREATE INDEX IF NOT EXISTS webhook_deliveries_user_idx ON engine.webhook_deliveries (user_id);
