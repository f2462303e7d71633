-- 0013 — a turn's idempotency key names its user (issue 13: a schema that can be partitioned or sharded by user).
--
-- A message is unique per (session, client_turn_id, role): that is what makes a retried turn a replay, and it
-- is the conflict target of the turn's INSERT ... ON CONFLICT statements (store/chat.py). A table partitioned
-- by hash of user_id (or distributed by it, as Citus does) can only enforce a unique key that includes
-- user_id, and an ON CONFLICT target must name a key the table has, so with the old key chat_messages was the
-- one user table that could not be partitioned (tests/test_partitioned_by_user.py showed the turn failing).
-- Since 0010 a message's user is its session's user (the composite foreign key), so the wider key admits
-- exactly the same rows as the old one; it replaces it, and the statements name user_id in their target.
-- Building the index reads the table once under a lock that blocks writes: seconds at today's sizes.
ALTER TABLE engine.chat_messages
    ADD CONSTRAINT chat_messages_turn_key UNIQUE (session_id, client_turn_id, role, user_id);
ALTER TABLE engine.chat_messages DROP CONSTRAINT chat_messages_session_id_client_turn_id_role_key;
