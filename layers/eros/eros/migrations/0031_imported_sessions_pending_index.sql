-- 0031 — the index behind dreaming's order for imported sessions (issue 28).
--
-- Dreaming takes a user's imported sessions (migration 0029) one at a time, oldest first (eros.store.dreaming's
-- claim): a session waits while an older imported session of its user is not extracted yet, so that a fact of 2024
-- is superseded by the one of 2025 and never the reverse. This index answers that question with one probe, however
-- many sessions an import made. Over the imported sessions not extracted only: on an existing database, empty.
CREATE INDEX IF NOT EXISTS chat_sessions_imported_pending_idx
    ON engine.chat_sessions (user_id, last_active_at) WHERE external_id IS NOT NULL AND extracted_at IS NULL;
