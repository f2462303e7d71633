-- The application role's grants (current definition; README.md here says how this file is applied). Created by
-- migration 0019, which says why each table gets what it gets: eros_app may do to each table what the runtime
-- does to it, and nothing more (tests/test_migrations.py holds each table to it):
--
--   schema_migrations, schema_objects,  SELECT: written by the migrations' own user only (a user's own characters
--   personas, persona_versions          through the SECURITY DEFINER functions of personas.sql, as that user)
--   chat_messages                       SELECT, INSERT, DELETE (retention, erasure): a message is never changed
--   persona_instances                   SELECT, INSERT, DELETE, and UPDATE of user_id alone: create_session's
--                                       INSERT .. ON CONFLICT DO UPDATE SET user_id = EXCLUDED.user_id returns
--                                       the user's existing instance (store/chat.py); persona_id cannot change
--   relationship_terms                  SELECT, INSERT, DELETE: written by the trigger of migration 0027 as the
--                                       role that writes the memory; a term row is never changed
--   embedding_space                     SELECT, INSERT, UPDATE: embedding.sql's trigger records the first vector's
--                                       model as the role that writes it, and the next one once none of it is
--                                       left; the runtime never removes the row
--   embedding_calibrations              SELECT, INSERT: `eros calibrate` adds a row; a row is never changed
--   apps                                SELECT: apps are made, set and deleted by operators at the command line
--                                       (`eros apps`), with the migration credentials (migration 0036)
--   app_keys                            SELECT, INSERT, UPDATE: an app's operator makes, rotates and revokes its
--                                       keys through the API (a revoked key is kept, refused); a row is deleted
--                                       only with its app
--   app_webhooks, webhook_deliveries    SELECT, INSERT, UPDATE, DELETE (the default below): an app's operator
--                                       sets and deletes its endpoint through the API; the sweeper writes each
--                                       delivery's attempts, erasure deletes a user's (migration 0037)
--   every other table                   SELECT, INSERT, UPDATE, DELETE (sessions, memories, dreaming and usage
--                                       state are updated in place); a later migration's table gets the same by
--                                       0006's default privileges until a line here narrows it
--
-- No TRUNCATE, REFERENCES or TRIGGER anywhere; sequences USAGE and SELECT (nextval), never setval.
-- eros.migrate calls it after every run (for a table created by a user other than the migrating one), after the
-- files of this folder are applied. Only its owner, the migrating user, may call it.
CREATE OR REPLACE PROCEDURE engine.grant_app_role() LANGUAGE plpgsql AS $$
BEGIN
    GRANT USAGE ON SCHEMA engine TO eros_app;
    GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA engine TO eros_app;
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA engine TO eros_app;
    REVOKE INSERT, UPDATE, DELETE ON engine.schema_migrations, engine.schema_objects, engine.personas,
        engine.persona_versions FROM eros_app;
    REVOKE UPDATE ON engine.chat_messages FROM eros_app;
    REVOKE UPDATE ON engine.persona_instances FROM eros_app;
    REVOKE UPDATE ON engine.relationship_terms FROM eros_app;
    REVOKE DELETE ON engine.embedding_space FROM eros_app;
    REVOKE UPDATE, DELETE ON engine.embedding_calibrations FROM eros_app;
    REVOKE INSERT, UPDATE, DELETE ON engine.apps FROM eros_app;
    REVOKE DELETE ON engine.app_keys FROM eros_app;
    GRANT UPDATE (user_id) ON engine.persona_instances TO eros_app;
END
$$;

REVOKE ALL ON PROCEDURE engine.grant_app_role() FROM PUBLIC;
