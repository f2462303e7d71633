-- 0008 — one name per idea (issue 9): the background process is "dreaming", the step that distils one
-- session is "extraction", and the point up to which a session has been read is its "extraction watermark".
--
-- The bookkeeping columns of migrations 0001, 0002 and 0005 were named after the SPEC's earlier word,
-- "classification", while the code, the metrics, the Lambda function and the docs said "extract". A
-- reader had to learn that classified_at, "extracted" and "dreamt" were the same moment. Renames only:
-- no data moves, indexes and their partial predicates follow the columns, and the rename takes an
-- ACCESS EXCLUSIVE lock for an instant (no table rewrite).
ALTER TABLE engine.chat_sessions RENAME COLUMN classified_at TO extracted_at;
ALTER TABLE engine.chat_sessions RENAME COLUMN classification_claimed_at TO extraction_claimed_at;
ALTER TABLE engine.chat_sessions RENAME COLUMN classified_through_message_id TO extraction_watermark;
ALTER TABLE engine.chat_sessions RENAME COLUMN classification_attempts TO extraction_attempts;
ALTER TABLE engine.chat_sessions RENAME COLUMN classification_error TO extraction_error;
ALTER TABLE engine.chat_sessions RENAME COLUMN classification_next_attempt_at TO extraction_next_attempt_at;
ALTER TABLE engine.chat_sessions RENAME COLUMN classification_retries TO extraction_retries;
ALTER TABLE engine.chat_sessions RENAME COLUMN classification_retrying_since TO extraction_retrying_since;
ALTER TABLE engine.chat_sessions RENAME COLUMN classification_started_at TO extraction_started_at;
ALTER TABLE engine.chat_sessions RENAME COLUMN classification_gave_up TO extraction_gave_up;
-- The CHECK of 0005 keeps its generated name through the column rename; give it the new one.
ALTER TABLE engine.chat_sessions RENAME CONSTRAINT chat_sessions_classification_gave_up_check
    TO chat_sessions_extraction_gave_up_check;
