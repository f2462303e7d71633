-- 0030 — personas are data (issue 28): versioned, retirable, and made by users as well as by the app.
--
-- Until now the three personas were rows copied from the package's JSON files at each migrate, and a changed prompt
-- changed every session's character at once, mid-conversation. Now:
-- * engine.persona_versions keeps every version of a persona's name, description and prompt; engine.personas
--   names the current one (`version`). A session keeps the version it started with (chat_sessions.persona_version;
--   NULL for the sessions before this migration, which are on version 1, the text they had): a turn's prompt
--   comes from that version (sql/functions/turn.sql), so an edit shows in new sessions only.
-- * `retired_at`: a retired persona is listed to no one and starts no session; its sessions go on.
-- * `owner_id`: a character a user made (visible to, and usable by, that user alone; erased with them); NULL: one
--   of the app's, which operators manage (`eros personas`; the shipped three stay seeded from the package).
ALTER TABLE engine.personas
    ADD COLUMN IF NOT EXISTS owner_id text CHECK (length(owner_id) BETWEEN 1 AND 255),
    ADD COLUMN IF NOT EXISTS version int NOT NULL DEFAULT 1 CHECK (version >= 1),
    ADD COLUMN IF NOT EXISTS retired_at timestamptz;
CREATE INDEX IF NOT EXISTS personas_owner_idx ON engine.personas (owner_id) WHERE owner_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS engine.persona_versions (
    persona_id    text NOT NULL REFERENCES engine.personas (id) ON DELETE CASCADE,
    version       int NOT NULL CHECK (version >= 1),
    name          text NOT NULL,
    description   text NOT NULL DEFAULT '',
    system_prompt text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (persona_id, version)
);
INSERT INTO engine.persona_versions (persona_id, version, name, description, system_prompt, created_at)
SELECT p.id, p.version, p.name, p.description, p.system_prompt, p.created_at FROM engine.personas p
ON CONFLICT (persona_id, version) DO NOTHING;

ALTER TABLE engine.chat_sessions ADD COLUMN IF NOT EXISTS persona_version int CHECK (persona_version >= 1);
