-- A chat turn's first and last statements, and the session's activity (current definitions; README.md here says
-- how this file is applied and what a changed signature must do). Created by migrations 0016 (which says why:
-- the plans of PL/pgSQL stay in the backend that runs them, which RDS Proxy never sees) and 0018 (the
-- reservations). Each function runs in one statement, so in one implicit transaction, and forces the generic
-- plan as turn_recall does: their parameters pick rows by key.
--
-- Lock order, for every statement of a turn: the user's usage rows, then the session's row, then memory rows.
-- Concurrent turns of one user cannot deadlock.

-- New messages make a session active again and, if it was extracted (or given up on), eligible for dreaming
-- again with a fresh attempts budget; extraction resumes after its watermark.
CREATE OR REPLACE FUNCTION engine.touch_session(of_user text, of_session uuid) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    UPDATE engine.chat_sessions SET last_active_at = now(), extracted_at = NULL, extraction_attempts = 0
    WHERE user_id = of_user AND id = of_session;
END
$$;

-- What open_turn_v2 returns: the session with its persona (every column NULL-free when there is a session), and
-- the turn's state. eros.store.chat.open_turn reads it.
DO $do$ BEGIN
    CREATE TYPE engine.opened_turn AS (
        id uuid, instance_id uuid, persona_id text, created_at timestamptz, last_active_at timestamptz,
        extracted_at timestamptz, persona_name text, system_prompt text,
        claimed_id bigint,    -- the user's message stored now (NULL: there was one, or the turn was refused)
        admitted boolean,     -- the spend limits let the turn through (always, when none is on)
        reservation uuid,     -- the turn's reservation (NULL: none made)
        reserved bigint,      -- its tokens (0: none)
        earlier jsonb,        -- the messages already stored under this turn id, by role
        history jsonb         -- the last of_history_size messages before the turn, oldest first
    );
EXCEPTION WHEN duplicate_object THEN NULL;  -- it exists: a type is never changed in place
END $do$;

-- A turn's first statement: everything it does before its model calls, one statement and one transaction. No
-- row: the session is not this user's, or there is none (every part reads `session`, so nothing else runs).
-- Its parts:
-- * stored: the messages already stored under this turn id (a retry's first attempt);
-- * recent: the last of_history_size messages (the turn's own excluded), read once, for the estimate and the
--   prompt (oldest first in `history`);
-- * estimate: under a budget, an upper estimate of what the turn can spend, made where the prompt's text is
--   known. Tokens are counted as UTF-8 bytes, since a token of a byte-level tokenizer spans at least one byte:
--   the persona's prompt, the history and the message (in the prompt, and again in the query embedding), 8
--   tokens of framing per message, plus of_reserve from the caller (eros.store.usage.turn_reserve: the reply's
--   cap, chat_max_tokens, the prompt's fixed text and an allowance for the recalled memories, which are not
--   known before the turn's recall);
-- * to_admit / counted: the turn admitted by engine.admit_v2 (of_limited: a limit is on; of_rate turns per
--   minute, of_budget tokens a day, 0 for off), counting it and reserving the estimate, unless it does not pay
--   a provider: the retry of an answered turn with the same message (a replay) and a turn whose id already holds
--   another message (a conflict, 409: the caller tells it before the refusal) are neither counted nor limited;
--   `counted` has a row when the turn was admitted and counted;
-- * claimed: the user's message, stored before any model call, claiming the turn id (the turn key decides between
--   concurrent senders), only when there is none yet and the turn was admitted; touched: the session's activity
--   (as touch_session), when the message was stored.
-- The admission locks the usage row before the session row is touched, as record_turn does. Every part reads one
-- snapshot, the statement's: a concurrent sender that stored its message after it began is neither in `stored`
-- nor beaten by `claimed` (ON CONFLICT waits for it, then does nothing); the caller then finds it
-- (eros.store.chat.claim_turn).
-- Every parameter is prefixed (of_) and the result is a composite type, so no name in the statement can be both a
-- column and a variable: a later column named like a parameter is an error, never a silent change. _v2: 0018's
-- engine.open_turn returned a TABLE whose columns were variables, resolved by #variable_conflict use_column.
CREATE OR REPLACE FUNCTION engine.open_turn_v2(
    of_user text, of_session uuid, of_turn text, of_message text, of_history_size int, of_limited boolean,
    of_day date, of_rate_window timestamptz, of_rate int, of_budget bigint, of_at timestamptz, of_reserve bigint,
    of_until timestamptz)
RETURNS SETOF engine.opened_turn
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH session AS (
        SELECT s.id, s.instance_id, i.persona_id, s.created_at, s.last_active_at, s.extracted_at,
               p.name AS persona_name, p.system_prompt
        FROM engine.chat_sessions s
        JOIN engine.persona_instances i ON i.id = s.instance_id
        JOIN engine.persona_versions p  -- the persona as the session started with it (migration 0030)
          ON p.persona_id = i.persona_id AND p.version = coalesce(s.persona_version, 1)
        WHERE s.id = of_session AND s.user_id = of_user
    ), stored AS (
        SELECT m.id, m.role, m.content, m.metadata FROM engine.chat_messages m
        WHERE m.user_id = of_user AND m.session_id = (SELECT session.id FROM session) AND m.client_turn_id = of_turn
    ), recent AS (
        SELECT m.id, m.role, m.content FROM engine.chat_messages m
        WHERE m.user_id = of_user AND m.session_id = of_session AND m.client_turn_id <> of_turn
        ORDER BY m.id DESC LIMIT of_history_size
    ), estimate AS (
        SELECT CASE WHEN of_budget > 0 THEN
                   of_reserve + octet_length(session.system_prompt) + 2 * octet_length(of_message) + 16
                   + (SELECT coalesce(sum(octet_length(recent.content) + 8), 0) FROM recent)
               ELSE 0 END AS tokens
        FROM session
    ), to_admit AS (
        SELECT estimate.tokens FROM estimate
        WHERE of_limited AND NOT EXISTS (SELECT FROM stored u WHERE u.role = 'user' AND (
                                             u.content <> of_message
                                             OR EXISTS (SELECT FROM stored a WHERE a.role = 'assistant')))
    ), counted AS MATERIALIZED (
        SELECT a.reservation, to_admit.tokens FROM to_admit,
            engine.admit_v2(of_user, of_day, of_at, of_rate_window, of_rate, of_budget, to_admit.tokens, of_until, 1)
                AS a(reservation)
    ), claimed AS (
        -- marked being answered by this request until of_until (eros.store.chat.ANSWERING says why)
        INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, metadata)
        SELECT session.id, of_user, 'user', of_message, of_turn, jsonb_build_object('answering_until', of_until)
        FROM session
        WHERE NOT EXISTS (SELECT FROM stored WHERE stored.role = 'user')
          AND (NOT of_limited OR EXISTS (SELECT FROM counted))
        ON CONFLICT (session_id, client_turn_id, role, user_id) DO NOTHING
        RETURNING chat_messages.id
    ), touched AS (
        UPDATE engine.chat_sessions SET last_active_at = now(), extracted_at = NULL, extraction_attempts = 0
        WHERE chat_sessions.user_id = of_user AND chat_sessions.id = of_session AND EXISTS (SELECT FROM claimed)
    )
    SELECT session.*, (SELECT claimed.id FROM claimed),
           NOT of_limited OR EXISTS (SELECT FROM counted),
           (SELECT counted.reservation FROM counted),
           coalesce((SELECT counted.tokens FROM counted WHERE counted.reservation IS NOT NULL), 0)::bigint,
           (SELECT coalesce(jsonb_object_agg(stored.role, to_jsonb(stored)), '{}') FROM stored),
           (SELECT coalesce(jsonb_agg(h ORDER BY h.id), '[]') FROM recent h)
    FROM session;
END
$$;

-- A turn's last statement: its reply and what goes with it, one statement and one transaction. Returns the reply's
-- id, or NULL when a concurrent sender of the same message stored its reply first (keep that one). In order:
-- * the session, locked FOR KEY SHARE: a turn runs for seconds, and DELETE /v1/me (eros.store.account.erase) can
--   delete the session meanwhile. An erasure that committed first leaves no row, and the turn raises
--   `session_gone` (SQLSTATE EG409, eros.store.chat.SessionGone) having written and counted nothing (the erasure
--   deletes, or has deleted, the usage row with the reservation); an erasure that comes after waits for this
--   statement and deletes what it wrote. KEY SHARE conflicts neither with the activity's update of the session
--   row (touch_session) nor with what concurrent turns lock, so the lock order above holds;
-- * the turn's provider calls (engine.spend, settling the turn's reservation), recorded even when the reply is
--   not (they were paid for): the usage rows are locked before the session row is updated;
-- * the assistant's message, unless a concurrent sender's is there;
-- * with the reply only: the session's activity, and the user's message in the relationship layer, as an
--   utterance with the embedding recall already paid for.
CREATE OR REPLACE FUNCTION engine.record_turn(of_user text, of_session uuid, of_instance uuid, turn text, reply text,
                                              reply_metadata jsonb, message text, message_id bigint,
                                              message_embedding vector, utterance_metadata jsonb, of_day date,
                                              purposes text[], models text[], inputs bigint[], outputs bigint[],
                                              reservation uuid) RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    reply_id bigint;
BEGIN
    PERFORM FROM engine.chat_sessions s WHERE s.user_id = of_user AND s.id = of_session FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'session % is gone', of_session USING ERRCODE = 'EG409';
    END IF;
    PERFORM engine.spend(of_user, of_day, purposes, models, inputs, outputs, reservation);
    INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, metadata)
    VALUES (of_session, of_user, 'assistant', reply, turn, reply_metadata)
    ON CONFLICT (session_id, client_turn_id, role, user_id) DO NOTHING
    RETURNING id INTO reply_id;
    IF reply_id IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM engine.touch_session(of_user, of_session);
    INSERT INTO engine.companion_memories (session_id, user_id, instance_id, content, embedding, source,
                                           from_message_id, through_message_id, metadata)
    VALUES (of_session, of_user, of_instance, message, message_embedding, 'utterance', message_id, message_id,
            utterance_metadata);
    RETURN reply_id;
END
$$;

-- What engine.append_messages returns for each message of an append, in the request's order: the message as
-- stored, and whether this call stored it (false: stored before under its client id and role, with the same text).
DO $do$ BEGIN
    CREATE TYPE engine.appended_message AS (
        place int, id bigint, role text, client_id text, content text, sent_at timestamptz, inserted boolean
    );
EXCEPTION WHEN duplicate_object THEN NULL;  -- it exists: a type is never changed in place
END $do$;

-- Messages an app's own chat pipeline produced (eros.ingest: POST /v1/sessions/{id}/messages, and the message of
-- POST .../context with store), written as a turn writes its own, in one call and one transaction:
-- * the session, locked FOR NO KEY UPDATE: appends to one session go one at a time, so the order in time checked
--   below holds when they commit; a turn's record_turn (KEY SHARE) does not wait for it, and erasure's DELETE
--   waits. No row: the session is not this user's (or was erased meanwhile);
-- * refused, writing nothing: a message whose client id and role hold another text (SQLSTATE EG412,
--   message_conflict), and a new message older than the session's newest (EG413, out_of_order), each naming the
--   message's place (0-based) in its DETAIL, as eros.store.chat reads it;
-- * the new messages, in the request's order (their ids follow it), at their time (of_times; NULL: when stored,
--   clock_timestamp(), so that the rows of one call keep their order), and for each new user message whose
--   client id is in of_embedded its utterance in the relationship layer with that vector, at the message's time,
--   as record_turn stores a turn's; when anything was stored, the session made eligible for dreaming again (as
--   touch_session does) and active as of its newest message: an imported conversation is quiet as of its last
--   message, so dreaming takes imported sessions oldest first (the sweep's claim orders by last_active_at).
-- The caller (eros.ingest.plan) refused what it could before paying for the embeddings; what is checked here is
-- what a concurrent request can change meanwhile.
CREATE OR REPLACE FUNCTION engine.append_messages(
    of_user text, of_session uuid, of_roles text[], of_contents text[], of_ids text[], of_times timestamptz[],
    of_embedded text[], of_vectors vector[], of_model text)
RETURNS SETOF engine.appended_message
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    of_instance uuid;
    newest timestamptz;
    refused int;
BEGIN
    SELECT s.instance_id INTO of_instance FROM engine.chat_sessions s
    WHERE s.user_id = of_user AND s.id = of_session FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT i.place - 1 INTO refused
    FROM unnest(of_roles, of_contents, of_ids) WITH ORDINALITY AS i(role, content, client_id, place)
    JOIN engine.chat_messages m ON m.user_id = of_user AND m.session_id = of_session
                                AND m.client_turn_id = i.client_id AND m.role = i.role
    WHERE m.content <> i.content
    ORDER BY i.place LIMIT 1;
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'message % reuses a client id for another text', refused
            USING ERRCODE = 'EG412', DETAIL = refused::text;
    END IF;
    SELECT m.sent_at INTO newest FROM engine.chat_messages m
    WHERE m.user_id = of_user AND m.session_id = of_session ORDER BY m.id DESC LIMIT 1;
    SELECT i.place - 1 INTO refused
    FROM unnest(of_roles, of_ids, of_times) WITH ORDINALITY AS i(role, client_id, at, place)
    WHERE i.at < newest
      AND NOT EXISTS (SELECT FROM engine.chat_messages m
                      WHERE m.user_id = of_user AND m.session_id = of_session
                        AND m.client_turn_id = i.client_id AND m.role = i.role)
    ORDER BY i.place LIMIT 1;
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'message % is older than the session''s newest, at %', refused, newest
            USING ERRCODE = 'EG413', DETAIL = refused::text || ' ' || newest::text;
    END IF;
    RETURN QUERY
    WITH incoming AS (
        SELECT * FROM unnest(of_roles, of_contents, of_ids, of_times) WITH ORDINALITY AS i(role, content, client_id,
                                                                                           at, place)
    ), inserted AS (
        INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, sent_at)
        SELECT of_session, of_user, i.role, i.content, i.client_id, coalesce(i.at, clock_timestamp())
        FROM incoming i ORDER BY i.place
        ON CONFLICT (session_id, client_turn_id, role, user_id) DO NOTHING
        RETURNING chat_messages.id, chat_messages.role, chat_messages.client_turn_id, chat_messages.content,
                  chat_messages.sent_at
    ), utterances AS (
        INSERT INTO engine.companion_memories (session_id, user_id, instance_id, content, embedding, source,
                                               from_message_id, through_message_id, metadata, created_at)
        SELECT of_session, of_user, of_instance, n.content, e.embedding, 'utterance', n.id, n.id,
               jsonb_build_object('message_id', n.id, 'embed_model', of_model), n.sent_at
        FROM inserted n JOIN unnest(of_embedded, of_vectors) AS e(client_id, embedding) ON e.client_id = n.client_turn_id
        WHERE n.role = 'user'
    ), touched AS (  -- quiet as of its newest message: an imported conversation is as old as its last message
        UPDATE engine.chat_sessions SET last_active_at = (SELECT max(n.sent_at) FROM inserted n), extracted_at = NULL,
                                        extraction_attempts = 0
        WHERE chat_sessions.user_id = of_user AND chat_sessions.id = of_session AND EXISTS (SELECT FROM inserted)
    )
    SELECT i.place::int, coalesce(n.id, m.id), i.role, i.client_id, coalesce(n.content, m.content),
           coalesce(n.sent_at, m.sent_at), n.id IS NOT NULL
    FROM incoming i
    LEFT JOIN inserted n ON n.client_turn_id = i.client_id AND n.role = i.role
    LEFT JOIN engine.chat_messages m ON m.user_id = of_user AND m.session_id = of_session
                                     AND m.client_turn_id = i.client_id AND m.role = i.role
    ORDER BY i.place;
END
$$;
