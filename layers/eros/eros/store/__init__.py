"""Data access: every SQL statement the engine runs for a chat turn, a sweep, an extraction or a deep pass
lives in these modules, as named constants next to a comment that says why it is shaped so. The schema
itself lives in ``migrations/``; the migration runner (``eros.migrate``) keeps its own bookkeeping SQL
(advisory lock, ``schema_migrations``, the persona seed, the application role), and ``eros.health``
pings the database with ``SELECT 1``. Row shapes returned to callers are in ``rows``."""
