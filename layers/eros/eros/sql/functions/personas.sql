-- Characters users make (migration 0030), written through these functions alone (current definitions; README.md here
-- says how this file is applied). The app role may only read engine.personas and engine.persona_versions
-- (grants.sql), so no runtime path can change one of the app's personas, whose prompts every user's sessions run
-- on; these run as their owner, the migrating user (SECURITY DEFINER, with a fixed search_path), and touch only the
-- rows of_owner owns. The app's personas are the operators': through engine.keep_app_persona and
-- engine.retire_app_persona (below), which the operator API calls for callers with the operator scope, or at the
-- command line (eros personas) with the migration credentials; and the package's seed (eros.migrate).

-- A user's character, made (version 1) or edited (the next version), and the version row: the persona row names
-- the current version, a session keeps the one it started with (chat_sessions.persona_version). Returns the
-- version; NULL: of_id is taken by another user's persona or one of the app's, or is retired.
CREATE OR REPLACE FUNCTION engine.keep_user_persona(of_owner text, of_id text, of_name text, of_description text,
                                                    of_prompt text)
RETURNS int
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kept int;
BEGIN
    INSERT INTO engine.personas AS p (id, name, description, system_prompt, owner_id, version, app_id)
    VALUES (of_id, of_name, of_description, of_prompt, of_owner, 1, engine.app_of(of_owner))
    ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, description = EXCLUDED.description,
                                   system_prompt = EXCLUDED.system_prompt, version = p.version + 1
    WHERE p.owner_id = of_owner AND p.retired_at IS NULL
    RETURNING p.version INTO kept;
    IF kept IS NOT NULL THEN
        INSERT INTO engine.persona_versions (persona_id, version, name, description, system_prompt)
        VALUES (of_id, kept, of_name, of_description, of_prompt);
    END IF;
    RETURN kept;
END
$$;

-- Retire a user's character: listed no more and starts no session; its sessions go on. False: not of_owner's, or
-- retired already.
CREATE OR REPLACE FUNCTION engine.retire_user_persona(of_owner text, of_id text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH retired AS (
        UPDATE engine.personas SET retired_at = now()
        WHERE id = of_id AND owner_id = of_owner AND retired_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM retired)
$$;

-- Erase a user's characters with their versions (eros.store.account.erase, after the user's persona instances):
-- how many.
CREATE OR REPLACE FUNCTION engine.erase_user_personas(of_owner text) RETURNS int
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (DELETE FROM engine.personas WHERE owner_id = of_owner RETURNING 1)
    SELECT count(*)::int FROM gone
$$;

-- An app's personas, for the operator API (/v1/operator/personas: a caller with the operator scope of of_app, or
-- of_app's API key), for operators at the command line (eros personas --app) and for the package's seed (the first
-- app's): made, or a new version when the text changed. NULL: nothing changed, or of_id is taken by a user's
-- character or by another app's persona (persona ids are the deployment's: a session names its persona by id).
CREATE OR REPLACE FUNCTION engine.keep_app_persona_v2(of_app text, of_id text, of_name text, of_description text,
                                                      of_prompt text)
RETURNS int
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH kept AS (
        INSERT INTO engine.personas AS p (id, name, description, system_prompt, app_id)
        VALUES (of_id, of_name, of_description, of_prompt, of_app)
        ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, description = EXCLUDED.description,
                                       system_prompt = EXCLUDED.system_prompt, version = p.version + 1
        WHERE p.owner_id IS NULL AND p.app_id = of_app
          AND (p.name, p.description, p.system_prompt) IS DISTINCT FROM (EXCLUDED.name, EXCLUDED.description,
                                                                          EXCLUDED.system_prompt)
        RETURNING p.id, p.version, p.name, p.description, p.system_prompt
    ), versioned AS (
        INSERT INTO engine.persona_versions (persona_id, version, name, description, system_prompt)
        SELECT * FROM kept ON CONFLICT DO NOTHING
    )
    SELECT (SELECT version FROM kept)
$$;

-- Retire one of of_app's personas: listed no more, starts no session; its sessions go on.
CREATE OR REPLACE FUNCTION engine.retire_app_persona_v2(of_app text, of_id text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH retired AS (
        UPDATE engine.personas SET retired_at = now()
        WHERE id = of_id AND owner_id IS NULL AND app_id = of_app AND retired_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM retired)
$$;

-- The previous release's two (the _v2 rule), for its containers while a deploy replaces them: the first app's.
CREATE OR REPLACE FUNCTION engine.keep_app_persona(of_id text, of_name text, of_description text, of_prompt text)
RETURNS int
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT engine.keep_app_persona_v2('default', of_id, of_name, of_description, of_prompt)
$$;

CREATE OR REPLACE FUNCTION engine.retire_app_persona(of_id text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT engine.retire_app_persona_v2('default', of_id)
$$;

REVOKE ALL ON FUNCTION engine.keep_user_persona(text, text, text, text, text), engine.retire_user_persona(text, text),
    engine.erase_user_personas(text), engine.keep_app_persona(text, text, text, text),
    engine.retire_app_persona(text), engine.keep_app_persona_v2(text, text, text, text, text),
    engine.retire_app_persona_v2(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION engine.keep_user_persona(text, text, text, text, text),
    engine.retire_user_persona(text, text), engine.erase_user_personas(text), engine.keep_app_persona(text, text, text, text),
    engine.retire_app_persona(text), engine.keep_app_persona_v2(text, text, text, text, text),
    engine.retire_app_persona_v2(text, text) TO eros_app;
