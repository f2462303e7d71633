-- 0019 — the application's role may do to each table what the runtime does to it, and nothing more.
--
-- 0006 gave eros_app SELECT, INSERT, UPDATE and DELETE on every table (but schema_migrations), and
-- eros.migrate granted that again after every run. So a SQL injection or a bug in a request path could
-- have rewritten every persona's system prompt (engine.personas, which only the migrations' seed writes)
-- or changed what a user said in the stored transcript (engine.chat_messages, whose rows the runtime only
-- inserts, reads and deletes). Now:
--
--   schema_migrations, personas   SELECT: written by the migrations' own user only
--   chat_messages                 SELECT, INSERT, DELETE (retention, erasure): a message is never changed
--   persona_instances             SELECT, INSERT, DELETE, and UPDATE of user_id alone: create_session's
--                                 INSERT .. ON CONFLICT DO UPDATE SET user_id = EXCLUDED.user_id returns the
--                                 user's existing instance (store/chat.py); persona_id cannot be changed
--   every other table             SELECT, INSERT, UPDATE, DELETE (sessions, memories, dreaming and usage
--                                 state are updated in place); a later migration's table gets the same by
--                                 0006's default privileges until a line here narrows it
--
-- No TRUNCATE, REFERENCES or TRIGGER anywhere; sequences USAGE and SELECT (nextval), never setval.
--
-- The grants are one procedure, engine.grant_app_role(), called here and by eros.migrate after every run
-- (for a table created by a user other than the migrating one), so the two cannot disagree. Only its
-- owner, the migrating user, may call it. tests/test_migrations.py holds each table to its line above.
CREATE PROCEDURE engine.grant_app_role() LANGUAGE plpgsql AS $$
BEGIN
    GRANT USAGE ON SCHEMA engine TO eros_app;
    GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA engine TO eros_app;
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA engine TO eros_app;
    REVOKE INSERT, UPDATE, DELETE ON engine.schema_migrations, engine.personas FROM eros_app;
    REVOKE UPDATE ON engine.chat_messages FROM eros_app;
    REVOKE UPDATE ON engine.persona_instances FROM eros_app;
    GRANT UPDATE (user_id) ON engine.persona_instances TO eros_app;
END
$$;

REVOKE ALL ON PROCEDURE engine.grant_app_role() FROM PUBLIC;

CALL engine.grant_app_role();
