-- 0020 — each database function has one current definition, in one file, and an applied migration is never
-- edited (issue 26).
--
-- Migrations 0015-0019 put the turn's statements, the spend reservations, the version chains and the app role's
-- grants into functions. A change to one of them meant a new migration repeating its whole body, and some
-- migrations were edited after they were committed instead, while eros.migrate recorded only their names: a
-- database migrated in between kept the old text without a word. Now, as Flyway and sqlx do:
--
-- * engine.schema_migrations records each migration's SHA-256; eros.migrate refuses a run (on deploy; the local
--   stack warns) when an applied migration's file no longer has it. Rows applied before this column existed get
--   their file's checksum as it is when this runner first sees them.
-- * The current definition of every function, procedure, trigger and composite type the code calls is one file
--   of eros/sql/functions/, applied after the migrations, in the same locked run, whenever its SHA-256 differs
--   from the one recorded here (Flyway's repeatable migrations). The migrations that first created them keep
--   their bodies as history. What may not go there (engine.lexemes, which a STORED column uses), and the
--   versioned name a changed signature takes, are in eros/sql/functions/README.md.
ALTER TABLE engine.schema_migrations ADD COLUMN sha256 text;

CREATE TABLE engine.schema_objects (
    name       text PRIMARY KEY,  -- functions/<file name without .sql>
    sha256     text NOT NULL,     -- of the file's text as last applied
    applied_at timestamptz NOT NULL DEFAULT now()
);
