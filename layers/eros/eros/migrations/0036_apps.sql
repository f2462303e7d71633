-- 0036 — apps (tenants, issue 32): one deployment serves several apps, each with its own users, personas, settings,
-- usage and API keys.
--
-- How a user's rows are scoped by app: the engine's user key (the user_id of every table of a user's data) names
-- the app. A user of the first app, 'default', keeps the bare subject of their token as before (no stored row
-- changes); a user of any other app is '<app>' || chr(31) || '<subject>'. U+001F (unit separator) is refused in a
-- token's subject (functions/chat/routes), so the two forms never meet, and engine.app_of (sql/functions/apps.sql)
-- reads the app back. Every statement that names its user therefore names the app too (tests/test_shard_ready.py
-- holds every statement to it, and lists the few that span apps), and no table needed a new column
-- or a rewrite. The app's personas carry the app as a column: they are the app's, not a user's.
CREATE TABLE IF NOT EXISTS engine.apps (
    id         text PRIMARY KEY CHECK (id ~ '^[a-z][a-z0-9-]{1,39}$'),
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    -- What the app sets for itself over the deployment's settings (eros.apps.AppSettings names the keys):
    -- limits, budgets, models, retention.
    settings   jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(settings) = 'object'),
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Set when its deletion began: from then on no key or token of the app is accepted (eros.store.apps).
    deleted_at timestamptz
);
INSERT INTO engine.apps (id, name) VALUES ('default', 'default') ON CONFLICT (id) DO NOTHING;

-- An app's API keys, for its servers. The key itself is shown once, when it is made; only its SHA-256 is kept (a
-- key is 256 random bits: a fast hash is as good as a slow one against guessing, and a lookup is one index probe).
-- ``prefix`` (the key's first characters) tells keys apart in a listing. A revoked key is kept, refused.
CREATE TABLE IF NOT EXISTS engine.app_keys (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    app_id        text NOT NULL REFERENCES engine.apps (id) ON DELETE CASCADE,
    name          text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    prefix        text NOT NULL,
    secret_sha256 bytea NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz,
    replaced_by   uuid REFERENCES engine.app_keys (id)  -- a rotation's new key
);
CREATE INDEX IF NOT EXISTS app_keys_app_idx ON engine.app_keys (app_id, created_at);

-- The app's personas are the app's own; a user's character is their app's (set by engine.keep_user_persona from its
-- owner's key). The shipped personas and every existing one stay the first app's.
ALTER TABLE engine.personas ADD COLUMN IF NOT EXISTS app_id text NOT NULL DEFAULT 'default'
    REFERENCES engine.apps (id);
CREATE INDEX IF NOT EXISTS personas_app_idx ON engine.personas (app_id, id) WHERE owner_id IS NULL;
