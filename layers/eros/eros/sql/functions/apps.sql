-- Apps (tenants, migration 0036): current definitions; README.md here says how this file is applied.

-- The app a user key belongs to: the part before U+001F, or 'default' for a bare subject (a user of the first app,
-- whose keys predate apps). eros.apps.user_key writes the keys; this reads them in statements that span users
-- (an app's usage report, its deletion's scan). IMMUTABLE: it reads nothing but its argument.
CREATE OR REPLACE FUNCTION engine.app_of(user_key text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN strpos(user_key, chr(31)) > 0 THEN split_part(user_key, chr(31), 1) ELSE 'default' END
$$;
