-- 0002 — bookkeeping for dreaming-lite (the background extraction of profile memories).

-- How far extraction has read: messages with a larger id are new. A session that gets new turns
-- after it was classified is extracted again from here on, never from the start (resumed
-- sessions), and a transcript too long for one model call is worked through window by window.
ALTER TABLE engine.chat_sessions ADD COLUMN classified_through_message_id bigint;

-- Claims started on this session and the last failure. Without a cap, a session whose
-- extraction keeps failing (or keeps killing its worker) would be re-claimed every sweep forever
-- and eat the sweep quota; after DREAMING_MAX_ATTEMPTS it is stamped with the error instead.
ALTER TABLE engine.chat_sessions ADD COLUMN classification_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE engine.chat_sessions ADD COLUMN classification_error text;
