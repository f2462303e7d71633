"""Data access: the SQL the engine runs, as named constants next to a comment that says why it is shaped so,
and the calls of the database's own functions. A chat turn's three statements and recall are functions in the
database (``eros/sql/functions/*.sql``, their one current definition each); these modules hold their calls.
The schema's history is ``migrations/``; the migration runner (``eros.migrate``) keeps its own bookkeeping SQL
(advisory lock, ``schema_migrations``, ``schema_objects``, the persona seed, the application role), and
``eros.health`` pings the database with ``SELECT 1``. Row shapes returned to callers are in ``rows``."""
