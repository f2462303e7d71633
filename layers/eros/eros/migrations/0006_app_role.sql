-- 0006 — the application's own database role: reads and writes rows, never changes the schema.
--
-- The chat, sweeper and extract functions used to log in with the migration's credentials, which may
-- create, alter and drop anything: a SQL injection or a bug in a request path could have dropped a
-- table. They now log in as a user that is a member of the NOLOGIN group role eros_app, which has
-- USAGE on schema engine and SELECT/INSERT/UPDATE/DELETE on its tables (SELECT only on
-- schema_migrations), and owns nothing: no CREATE, ALTER, DROP or TRUNCATE. The login user itself
-- (name and password from a Secrets Manager secret) is created by the migrate custom resource
-- (eros.migrate.ensure_app_user), because its password is not something a migration file may hold.
--
-- Roles belong to the cluster, not the database: the role may exist already (another database of
-- the same cluster, a second stack), and two databases migrating at once may race to create it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'eros_app') THEN
        CREATE ROLE eros_app NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- created meanwhile by a concurrent migration of another database
END
$$;

GRANT USAGE ON SCHEMA engine TO eros_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA engine TO eros_app;
REVOKE INSERT, UPDATE, DELETE ON engine.schema_migrations FROM eros_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA engine TO eros_app;

-- Tables and sequences that later migrations create (as the same migrating user) get the same rights;
-- eros.migrate re-grants after every run as well, in case another user applied a migration.
ALTER DEFAULT PRIVILEGES IN SCHEMA engine GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO eros_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA engine GRANT USAGE, SELECT ON SEQUENCES TO eros_app;
