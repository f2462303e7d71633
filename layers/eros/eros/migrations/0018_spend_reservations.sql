-- 0018 — the daily token budget reserves before a provider is paid (issue 25, item 3).
--
-- Until now the admission (engine.open_turn, 0016) checked `tokens < budget`, and tokens were added only when the
-- turn was recorded, after the model had answered. Every turn admitted while others were still waiting for the
-- model saw the same spend: 16 concurrent turns against a 3,000-token budget spent 16,752 tokens, 64 spent 67,008
-- (tests/test_spend_reservations.py, before this migration). Now a request that will pay a provider reserves an
-- upper estimate of its tokens on the user's day row when it is admitted, by the same locked upsert that checks
-- the limits, and the admission counts what is reserved as if it were spent. The statement that counts the real
-- usage removes the reservation (engine.spend), so that the two never add up twice.
--
-- The bound (docs/DESIGN.md, "Usage"): a request is admitted while spent + reserved < budget, and then reserves
-- R. So when every request uses at most what it reserved, the day ends with spent < budget + R_last, R_last being
-- the reservation of the last request admitted: the budget is overshot by less than one request's reservation.
--
-- Where the reservations live: on the day row itself, as a jsonb object {reservation id: {tokens, until}}. The
-- admission must read them under the row lock its upsert takes (ON CONFLICT DO UPDATE re-reads the row's latest
-- version); rows of another table would be read from the statement's snapshot, which misses reservations that
-- concurrent requests committed while this one waited for the lock. One user has only a few requests in flight
-- (the rate limit bounds them), so the object stays small.
--
-- A request that fails releases its reservation (engine.spend with the calls it did pay, if any). One that
-- cannot (its Lambda was killed at its timeout, its connection broke) leaves it behind: every reservation has an
-- expiry (`until`, eros.store.usage.RESERVATION_SECS after the admission, longer than the chat function can
-- run: template.yaml), after which it counts for nothing and the next admission drops it. A crashed container
-- can hold back a user's budget for a minute, never for the day.

ALTER TABLE engine.user_usage ADD COLUMN reservations jsonb NOT NULL DEFAULT '{}';

-- The current definition, and what it does and why: eros/sql/functions/spend.sql.
CREATE FUNCTION engine.reserved(reservations jsonb, at timestamptz) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT coalesce(sum((r.value->>'tokens')::bigint), 0)::bigint FROM jsonb_each(reservations) r
    WHERE (r.value->>'until')::timestamptz > at
$$;

-- The current definition, and what it does and why: eros/sql/functions/spend.sql.
CREATE FUNCTION engine.live_reservations(reservations jsonb, at timestamptz) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT coalesce(jsonb_object_agg(r.key, r.value), '{}') FROM jsonb_each(reservations) r
    WHERE (r.value->>'until')::timestamptz > at
$$;

-- The current definition (engine.admit_v2), and what it does and why: eros/sql/functions/spend.sql.
CREATE FUNCTION engine.admit(of_user text, of_day date, at timestamptz, rate_window timestamptz, rate int,
                             budget bigint, tokens bigint, until timestamptz, turn int)
RETURNS TABLE (reservation uuid)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    held uuid := CASE WHEN budget > 0 THEN gen_random_uuid() END;
BEGIN
    RETURN QUERY
    INSERT INTO engine.user_usage AS u (user_id, day, turns, window_start, window_turns, reservations)
    VALUES (of_user, of_day, turn, rate_window, 1,
            CASE WHEN held IS NULL THEN '{}'
                 ELSE jsonb_build_object(held, jsonb_build_object('tokens', tokens, 'until', until)) END)
    ON CONFLICT (user_id, day) DO UPDATE SET
        turns = u.turns + EXCLUDED.turns,
        window_turns = CASE WHEN u.window_start = EXCLUDED.window_start THEN u.window_turns + 1 ELSE 1 END,
        window_start = EXCLUDED.window_start,
        reservations = engine.live_reservations(u.reservations, at) || EXCLUDED.reservations
    WHERE (rate = 0 OR u.window_start IS DISTINCT FROM EXCLUDED.window_start OR u.window_turns < rate)
      AND (budget = 0 OR u.tokens + engine.reserved(u.reservations, at) < budget)
    RETURNING held;
END
$$;

-- engine.spend (0016) also settles: with `reservation`, it removes that reservation from the day row in the same
-- update that adds the real tokens, and counts only while the row is there. A reservation implies the row (the
-- admission made it), so a missing row is an erasure that deleted it: an erased user gets no usage back from a
-- request that was in flight. With no calls, it only releases (a request that failed before paying). Without a
-- reservation (no budget, dreaming), it counts as before. The old signature is dropped: CREATE OR REPLACE cannot
-- add a parameter, and two overloads would leave a caller free to skip the settlement.
DROP FUNCTION engine.record_turn(text, uuid, uuid, text, text, jsonb, text, bigint, vector, jsonb, date, text[],
                                 text[], bigint[], bigint[]);
DROP FUNCTION engine.spend(text, date, text[], text[], bigint[], bigint[]);
CREATE FUNCTION engine.spend(of_user text, of_day date, purposes text[], models text[], inputs bigint[],
                             outputs bigint[], reservation uuid DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    spent bigint;
    dreamt bigint;
BEGIN
    SELECT coalesce(sum(c.input_tokens + c.output_tokens), 0),
           coalesce(sum(c.input_tokens + c.output_tokens) FILTER (WHERE c.purpose IN ('extraction', 'deep_pass')), 0)
    INTO spent, dreamt
    FROM unnest(purposes, inputs, outputs) AS c(purpose, input_tokens, output_tokens);
    IF reservation IS NOT NULL THEN
        UPDATE engine.user_usage u SET tokens = u.tokens + spent, chat_tokens = u.chat_tokens + spent - dreamt,
            dream_tokens = u.dream_tokens + dreamt, reservations = u.reservations - reservation::text
        WHERE u.user_id = of_user AND u.day = of_day;
        IF NOT FOUND THEN
            RETURN;  -- erased while the request was in flight
        END IF;
    ELSIF spent > 0 THEN
        INSERT INTO engine.user_usage AS u (user_id, day, tokens, chat_tokens, dream_tokens)
        VALUES (of_user, of_day, spent, spent - dreamt, dreamt)
        ON CONFLICT (user_id, day) DO UPDATE SET tokens = u.tokens + EXCLUDED.tokens,
            chat_tokens = u.chat_tokens + EXCLUDED.chat_tokens, dream_tokens = u.dream_tokens + EXCLUDED.dream_tokens;
    END IF;

    INSERT INTO engine.user_model_usage AS m (user_id, day, purpose, model, calls, input_tokens, output_tokens)
    SELECT of_user, of_day, c.purpose, c.model, count(*), sum(c.input_tokens), sum(c.output_tokens)
    FROM unnest(purposes, models, inputs, outputs) AS c(purpose, model, input_tokens, output_tokens)
    GROUP BY c.purpose, c.model
    ON CONFLICT (user_id, day, purpose, model) DO UPDATE SET calls = m.calls + EXCLUDED.calls,
        input_tokens = m.input_tokens + EXCLUDED.input_tokens, output_tokens = m.output_tokens + EXCLUDED.output_tokens;
END
$$;

-- engine.open_turn (0016), with its admission now engine.admit's and a reservation for the turn: an upper estimate
-- of what the turn can spend, made where the prompt's text is known. Tokens are counted as UTF-8 bytes, since a
-- token of a byte-level tokenizer spans at least one byte: the persona's prompt, the history and the message (in
-- the prompt, and again in the query embedding), 8 tokens of framing per message, plus `reserve` from the caller
-- (eros.store.usage.turn_reserve: the reply's cap, chat_max_tokens, the prompt's fixed text and an allowance for
-- the recalled memories, which are not known before the turn's recall). The history is read once, for the
-- estimate and the prompt. Returns the reservation (its id, NULL when none was made, and its tokens) with the
-- rest. One part changes: a turn whose id already holds another message (a conflict, 409) is not admitted either,
-- as a replay is not: neither pays a provider, so neither counts against the rate or reserves; the caller tells the
-- conflict before the refusal. The other parts are 0016's, and so is the order in which rows are locked.
DROP FUNCTION engine.open_turn(text, uuid, text, text, int, boolean, date, timestamptz, int, bigint);
CREATE FUNCTION engine.open_turn(of_user text, of_session uuid, turn text, message text, history_size int,
                                 limited boolean, of_day date, rate_window timestamptz, rate int, budget bigint,
                                 at timestamptz, reserve bigint, until timestamptz)
RETURNS TABLE (id uuid, instance_id uuid, persona_id text, created_at timestamptz, last_active_at timestamptz,
               extracted_at timestamptz, persona_name text, system_prompt text, claimed_id bigint, admitted boolean,
               reservation uuid, reserved bigint, earlier jsonb, history jsonb)
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
    ), recent AS (
        SELECT m.id, m.role, m.content FROM engine.chat_messages m
        WHERE m.user_id = of_user AND m.session_id = of_session AND m.client_turn_id <> turn
        ORDER BY m.id DESC LIMIT history_size
    ), estimate AS (
        SELECT CASE WHEN budget > 0 THEN
                   reserve + octet_length(session.system_prompt) + 2 * octet_length(message) + 16
                   + (SELECT coalesce(sum(octet_length(recent.content) + 8), 0) FROM recent)
               ELSE 0 END AS tokens
        FROM session
    ), to_admit AS (
        SELECT estimate.tokens FROM estimate
        WHERE limited AND NOT EXISTS (SELECT FROM stored u WHERE u.role = 'user' AND (
                                          u.content <> message OR EXISTS (SELECT FROM stored a WHERE a.role = 'assistant')))
    ), counted AS MATERIALIZED (
        SELECT a.reservation, to_admit.tokens FROM to_admit,
            engine.admit(of_user, of_day, at, rate_window, rate, budget, to_admit.tokens, until, 1) a
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
           (SELECT counted.reservation FROM counted),
           coalesce((SELECT counted.tokens FROM counted WHERE counted.reservation IS NOT NULL), 0)::bigint,
           (SELECT coalesce(jsonb_object_agg(stored.role, to_jsonb(stored)), '{}') FROM stored),
           (SELECT coalesce(jsonb_agg(h ORDER BY h.id), '[]') FROM recent h)
    FROM session;
END
$$;

-- engine.record_turn (0016), which now settles the turn's reservation (engine.spend) and first makes sure that
-- the session is still there. A turn runs for seconds; DELETE /v1/me (eros.store.account.erase) can delete the
-- session meanwhile, and the reply's insert then failed on the missing session: a 500 for the turn. Now the
-- session is locked FOR KEY SHARE first: an erasure that committed first leaves no row, and the turn raises
-- `session_gone` (SQLSTATE EG409, eros.store.chat.SessionGone) having written and counted nothing (the erasure
-- deletes, or has deleted, the usage row with the reservation); an erasure that comes after waits for this
-- statement and deletes what it wrote. KEY SHARE does not conflict with the activity's update of the session row
-- (touch_session) nor with what concurrent turns lock, so the lock order of 0016 still holds.
CREATE FUNCTION engine.record_turn(of_user text, of_session uuid, of_instance uuid, turn text, reply text,
                                   reply_metadata jsonb, message text, message_id bigint, message_embedding vector,
                                   utterance_metadata jsonb, of_day date, purposes text[], models text[],
                                   inputs bigint[], outputs bigint[], reservation uuid) RETURNS bigint
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
