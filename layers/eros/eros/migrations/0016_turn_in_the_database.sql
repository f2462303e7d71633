-- 0016 — a turn's two other statements live in the database too, for the reason 0015 gives (issue 14).
--
-- With recall's plan kept (0015), the statement that opens a turn and the one that records it were the turn's
-- other parse-and-plan work: ~1.6 ms of a ~11 ms turn on the bench (bench/results/turn_overhead.md, measured
-- against the same statements prepared on the server, which RDS Proxy would pin). As PL/pgSQL functions their
-- plans stay in the backend that runs them, which the proxy never sees. What each statement does, and why, is
-- unchanged; it is written down here now. Each function runs in one statement, so in one implicit transaction,
-- as before, and the functions force the generic plan as turn_recall does: their parameters pick rows by key.
--
-- * engine.touch_session(): new messages make a session active again and, if it was extracted (or given up on),
--   eligible for dreaming again with a fresh attempts budget; extraction resumes after its watermark.
-- * engine.spend(): provider calls counted against the user's day.
-- * engine.open_turn(): everything a turn does before its model calls.
-- * engine.record_turn(): the reply and what goes with it.

CREATE FUNCTION engine.touch_session(of_user text, of_session uuid) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    UPDATE engine.chat_sessions SET last_active_at = now(), extracted_at = NULL, extraction_attempts = 0
    WHERE user_id = of_user AND id = of_session;
END
$$;

-- Provider calls (one element per call in each array) of one user on one UTC day: first their tokens on the
-- day's row (the row the daily budget reads; nothing when they reported none), chat and dreaming apart
-- (extraction and the deep pass are dreaming: eros.store.usage.PURPOSES), then each call under its purpose
-- and model (migration 0009). Always in that order: a turn locks its usage rows before its session's row, in
-- the order open_turn takes them, so that concurrent turns of one user cannot deadlock.
CREATE FUNCTION engine.spend(of_user text, of_day date, purposes text[], models text[], inputs bigint[],
                             outputs bigint[]) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    INSERT INTO engine.user_usage AS u (user_id, day, tokens, chat_tokens, dream_tokens)
    SELECT of_user, of_day, t.tokens, t.tokens - t.dream, t.dream
    FROM (SELECT coalesce(sum(c.input_tokens + c.output_tokens), 0) AS tokens,
                 coalesce(sum(c.input_tokens + c.output_tokens)
                          FILTER (WHERE c.purpose IN ('extraction', 'deep_pass')), 0) AS dream
          FROM unnest(purposes, inputs, outputs) AS c(purpose, input_tokens, output_tokens)) t
    WHERE t.tokens > 0
    ON CONFLICT (user_id, day) DO UPDATE SET tokens = u.tokens + EXCLUDED.tokens,
        chat_tokens = u.chat_tokens + EXCLUDED.chat_tokens, dream_tokens = u.dream_tokens + EXCLUDED.dream_tokens;

    INSERT INTO engine.user_model_usage AS m (user_id, day, purpose, model, calls, input_tokens, output_tokens)
    SELECT of_user, of_day, c.purpose, c.model, count(*), sum(c.input_tokens), sum(c.output_tokens)
    FROM unnest(purposes, models, inputs, outputs) AS c(purpose, model, input_tokens, output_tokens)
    GROUP BY c.purpose, c.model
    ON CONFLICT (user_id, day, purpose, model) DO UPDATE SET calls = m.calls + EXCLUDED.calls,
        input_tokens = m.input_tokens + EXCLUDED.input_tokens, output_tokens = m.output_tokens + EXCLUDED.output_tokens;
END
$$;

-- A turn's first statement: everything it does before its model calls, one statement and one transaction. No row:
-- the session is not this user's, or there is none (every part reads `session`, so nothing else runs). Its parts:
-- * stored: the messages already stored under this turn id (a retry's first attempt);
-- * to_admit / counted: the turn counted against the spend limits (limited: one is on; rate turns per minute,
--   budget tokens a day, 0 for off), when the turn is not the retry of an answered turn with the same message (a
--   replay is never limited). The count and the check are one upsert on the row's latest version (ON CONFLICT DO
--   UPDATE locks it), so concurrent turns of one user cannot overshoot a limit; `counted` has a row when the turn
--   was admitted and counted;
-- * claimed: the user's message, stored before any model call, claiming the turn id (the turn key decides between
--   concurrent senders), only when there is none yet and the turn was admitted; touched: the session's activity
--   (as touch_session), when the message was stored;
-- * history: the last history_size messages (the turn's own excluded), oldest first, for the prompt.
-- The admission locks the usage row before the session row is touched, as record_turn does. Every part reads one
-- snapshot, the statement's: a concurrent sender that stored its message after it began is neither in `stored`
-- nor beaten by `claimed` (ON CONFLICT waits for it, then does nothing); the caller then finds it
-- (eros.store.chat.claim_turn).
CREATE FUNCTION engine.open_turn(of_user text, of_session uuid, turn text, message text, history_size int,
                                 limited boolean, of_day date, rate_window timestamptz, rate int, budget bigint)
RETURNS TABLE (id uuid, instance_id uuid, persona_id text, created_at timestamptz, last_active_at timestamptz,
               extracted_at timestamptz, persona_name text, system_prompt text, claimed_id bigint, admitted boolean,
               earlier jsonb, history jsonb)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH session AS (
        SELECT s.id, s.instance_id, i.persona_id, s.created_at, s.last_active_at, s.extracted_at,
               p.name AS persona_name, p.system_prompt
        FROM engine.chat_sessions s
        JOIN engine.persona_instances i ON i.id = s.instance_id
        JOIN engine.personas p ON p.id = i.persona_id
        WHERE s.id = of_session AND s.user_id = of_user
    ), stored AS (
        SELECT m.id, m.role, m.content, m.metadata FROM engine.chat_messages m
        WHERE m.user_id = of_user AND m.session_id = (SELECT session.id FROM session) AND m.client_turn_id = turn
    ), to_admit AS (
        SELECT FROM session
        WHERE limited AND NOT EXISTS (SELECT FROM stored a JOIN stored u ON u.role = 'user'
                                      WHERE a.role = 'assistant' AND u.content = message)
    ), counted AS (
        INSERT INTO engine.user_usage AS u (user_id, day, turns, window_start, window_turns)
        SELECT of_user, of_day, 1, rate_window, 1 FROM to_admit
        ON CONFLICT (user_id, day) DO UPDATE SET
            turns = u.turns + 1,
            window_turns = CASE WHEN u.window_start = EXCLUDED.window_start THEN u.window_turns + 1 ELSE 1 END,
            window_start = EXCLUDED.window_start
        WHERE (rate = 0 OR u.window_start IS DISTINCT FROM EXCLUDED.window_start OR u.window_turns < rate)
          AND (budget = 0 OR u.tokens < budget)
        RETURNING u.turns
    ), claimed AS (
        INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id)
        SELECT session.id, of_user, 'user', message, turn FROM session
        WHERE NOT EXISTS (SELECT FROM stored WHERE stored.role = 'user')
          AND (NOT limited OR EXISTS (SELECT FROM counted))
        ON CONFLICT (session_id, client_turn_id, role, user_id) DO NOTHING
        RETURNING chat_messages.id
    ), touched AS (
        UPDATE engine.chat_sessions SET last_active_at = now(), extracted_at = NULL, extraction_attempts = 0
        WHERE chat_sessions.user_id = of_user AND chat_sessions.id = of_session AND EXISTS (SELECT FROM claimed)
    )
    SELECT session.*, (SELECT claimed.id FROM claimed),
           NOT limited OR EXISTS (SELECT FROM counted),
           (SELECT coalesce(jsonb_object_agg(stored.role, to_jsonb(stored)), '{}') FROM stored),
           (SELECT coalesce(jsonb_agg(h ORDER BY h.id), '[]') FROM (
                SELECT m.id, m.role, m.content FROM engine.chat_messages m
                WHERE m.user_id = of_user AND m.session_id = of_session AND m.client_turn_id <> turn
                ORDER BY m.id DESC LIMIT history_size) h)
    FROM session;
END
$$;

-- A turn's last statement: its reply and what goes with it, one statement and one transaction. Returns the reply's
-- id, or NULL when a concurrent sender of the same message stored its reply first (keep that one). In order:
-- * the turn's provider calls (spend), recorded even when the reply is not (they were paid for), first: the usage
--   rows are locked before the session row, in the order open_turn takes them;
-- * the assistant's message, unless a concurrent sender's is there;
-- * with the reply only: the session's activity, and the user's message in the relationship layer, as an
--   utterance with the embedding recall already paid for.
CREATE FUNCTION engine.record_turn(of_user text, of_session uuid, of_instance uuid, turn text, reply text,
                                   reply_metadata jsonb, message text, message_id bigint, message_embedding vector,
                                   utterance_metadata jsonb, of_day date, purposes text[], models text[],
                                   inputs bigint[], outputs bigint[]) RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    reply_id bigint;
BEGIN
    PERFORM engine.spend(of_user, of_day, purposes, models, inputs, outputs);
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
