-- 0010 — every table of a user's data carries the user key (issue 13: a schema that can be sharded by user).
--
-- chat_messages reached its user only through its session. A database sharded by user (Citus distributes
-- tables by a column and keeps pgvector; so does partitioning by hash of it) can send a statement to one
-- shard only when the statement names that column, and keeps a user's rows together only when every table
-- has it. Messages are the largest table of the schema after the memories, and the only one without it.
--
-- Backfilled from the sessions in one UPDATE: fine at today's sizes; a large deployment would backfill in
-- batches before setting NOT NULL. The composite foreign key makes a message's user its session's user (the
-- form Citus accepts between tables distributed by user: the key includes the distribution column), so no
-- writer can get them out of step; it needs (id, user_id) unique on the sessions, which id alone already is.
ALTER TABLE engine.chat_messages ADD COLUMN user_id text;
UPDATE engine.chat_messages m SET user_id = s.user_id FROM engine.chat_sessions s WHERE s.id = m.session_id;
ALTER TABLE engine.chat_messages ALTER COLUMN user_id SET NOT NULL;

ALTER TABLE engine.chat_sessions ADD CONSTRAINT chat_sessions_id_user_key UNIQUE (id, user_id);
ALTER TABLE engine.chat_messages ADD CONSTRAINT chat_messages_session_user_fkey
    FOREIGN KEY (session_id, user_id) REFERENCES engine.chat_sessions (id, user_id) ON DELETE CASCADE;
