-- 0001 — the foundation: personas, per-user persona instances, sessions, messages, and the
-- two-layer memory table. Everything lives in schema `engine` so the engine can share a
-- database with other applications without name clashes.

CREATE EXTENSION IF NOT EXISTS vector;

-- Personas are product content (seeded from files in the repo by `eros migrate`), not user data.
CREATE TABLE engine.personas (
    id            text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    name          text NOT NULL,
    description   text NOT NULL DEFAULT '',
    system_prompt text NOT NULL,
    metadata      jsonb NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- One instance per user x persona: the key of the relationship memory layer. A user who talks
-- to the same persona in many sessions keeps one shared history with it.
CREATE TABLE engine.persona_instances (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id    text NOT NULL,
    persona_id text NOT NULL REFERENCES engine.personas (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (user_id, persona_id)
);

-- classified_at (done) and classification_claimed_at (running) are two columns on purpose:
-- a claim that goes stale must be takeable again without forgetting whether the work finished.
CREATE TABLE engine.chat_sessions (
    id                        uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id                   text NOT NULL,
    instance_id               uuid NOT NULL REFERENCES engine.persona_instances (id),
    created_at                timestamptz NOT NULL DEFAULT now(),
    last_active_at            timestamptz NOT NULL DEFAULT now(),
    metadata                  jsonb NOT NULL DEFAULT '{}',
    classified_at             timestamptz,
    classification_claimed_at timestamptz
);
-- "my sessions", newest first.
CREATE INDEX chat_sessions_user_idx ON engine.chat_sessions (user_id, created_at DESC);
-- The sweeper's claim scans only unclassified sessions in idle order; a partial index keeps it
-- small however many classified sessions pile up.
CREATE INDEX chat_sessions_dreaming_idx ON engine.chat_sessions (last_active_at)
    WHERE classified_at IS NULL;

-- id is an identity so that history and pagination follow insertion order exactly (sent_at
-- can tie inside one transaction). client_turn_id makes a retried turn idempotent: the user's
-- message and the reply of one turn share it, once per role.
CREATE TABLE engine.chat_messages (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id     uuid NOT NULL REFERENCES engine.chat_sessions (id) ON DELETE CASCADE,
    role           text NOT NULL CHECK (role IN ('user', 'assistant')),
    content        text NOT NULL,
    client_turn_id text NOT NULL CHECK (length(client_turn_id) BETWEEN 1 AND 128),
    sent_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    metadata       jsonb NOT NULL DEFAULT '{}',
    UNIQUE (session_id, client_turn_id, role)
);
CREATE INDEX chat_messages_session_idx ON engine.chat_messages (session_id, id);

-- Both memory layers in one table: instance_id NULL = profile (who the user is, shared by all
-- personas); instance_id set = relationship (what happened between the user and one persona).
-- category is NULL only for relationship rows (raw utterances); the CHECK keeps the profile
-- vocabulary at the five categories so grouping never explodes in cardinality.
CREATE TABLE engine.companion_memories (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    session_id  uuid REFERENCES engine.chat_sessions (id) ON DELETE SET NULL,
    user_id     text NOT NULL,
    instance_id uuid REFERENCES engine.persona_instances (id) ON DELETE CASCADE,
    content     text NOT NULL CHECK (length(content) > 0),
    embedding   vector(512) NOT NULL,
    category    text CHECK (category IN ('fact', 'preference', 'event', 'emotion', 'relation')),
    importance  real CHECK (importance >= 0 AND importance <= 1),
    metadata    jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- Recall is always scoped to one user (and one instance for the relationship layer); with
-- ~100s of rows per user an exact scan of that user's rows beats an approximate ANN index that
-- would filter *after* the neighbour search and miss rows. Partial indexes per layer.
CREATE INDEX companion_memories_profile_idx ON engine.companion_memories (user_id, category)
    WHERE instance_id IS NULL;
CREATE INDEX companion_memories_relationship_idx ON engine.companion_memories (instance_id, created_at)
    WHERE instance_id IS NOT NULL;
-- Listing and deleting memories by their owner, and the session they came from.
CREATE INDEX companion_memories_session_idx ON engine.companion_memories (session_id);
