-- Spend: the one admission of every request that pays a provider, and the settlement of what it spent (current
-- definitions; README.md here says how this file is applied and what a changed signature must do). Created by
-- migrations 0016 (spend) and 0018 (the reservations, which says why the budget reserves before a provider is
-- paid); the bound they keep is in docs/DESIGN.md, "Usage".
--
-- The reservations live on the user's day row (engine.user_usage.reservations), as a jsonb object
-- {reservation id: {tokens, until}}: the admission must read them under the row lock its upsert takes (ON
-- CONFLICT DO UPDATE re-reads the row's latest version); rows of another table would be read from the
-- statement's snapshot, which misses reservations that concurrent requests committed while this one waited for
-- the lock. One user has only a few requests in flight (the rate limit bounds them), so the object stays small.
-- A request that fails releases its reservation (engine.spend with the calls it did pay, if any). One that
-- cannot (its Lambda was killed at its timeout, its connection broke) leaves it behind: every reservation has an
-- expiry (`until`, eros.store.usage.RESERVATION_SECS after the admission, longer than the chat function can
-- run: template.yaml), after which it counts for nothing and the next admission drops it.

-- The tokens the unexpired reservations hold at `at` (the request clock's now: eros.clock.now()).
CREATE OR REPLACE FUNCTION engine.reserved(reservations jsonb, at timestamptz) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT coalesce(sum((r.value->>'tokens')::bigint), 0)::bigint FROM jsonb_each(reservations) r
    WHERE (r.value->>'until')::timestamptz > at
$$;

-- The unexpired reservations alone: what an admission keeps of the row's.
CREATE OR REPLACE FUNCTION engine.live_reservations(reservations jsonb, at timestamptz) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT coalesce(jsonb_object_agg(r.key, r.value), '{}') FROM jsonb_each(reservations) r
    WHERE (r.value->>'until')::timestamptz > at
$$;

-- The one admission of every request that pays a provider (a chat turn: open_turn_v2; the memory API's
-- embeddings: eros.usage.admit): counted against the rate window (and, for a turn, the day's turns), and, under a
-- budget, reserving `of_tokens` until `of_until`. The count, the check and the reservation are one upsert on the
-- row's latest version (ON CONFLICT DO UPDATE locks it): concurrent requests of one user are admitted one after
-- the other, each seeing what the previous ones reserved. The day's first request is always admitted (nothing is
-- spent yet). Returns the reservation's id (NULL: nothing reserved, there is no budget), or no row when refused.
-- Every parameter is prefixed and the result is a plain uuid, so no name of the statement can be a column and a
-- variable at once (a later column named like a parameter is an error, never a silent change). _v2: 0018's
-- engine.admit returned TABLE (reservation uuid) and resolved such names to the column (#variable_conflict).
CREATE OR REPLACE FUNCTION engine.admit_v2(of_user text, of_day date, of_at timestamptz, of_rate_window timestamptz,
                                           of_rate int, of_budget bigint, of_tokens bigint, of_until timestamptz,
                                           of_turn int)
RETURNS SETOF uuid
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    held uuid := CASE WHEN of_budget > 0 THEN gen_random_uuid() END;
BEGIN
    RETURN QUERY
    INSERT INTO engine.user_usage AS u (user_id, day, turns, window_start, window_turns, reservations)
    VALUES (of_user, of_day, of_turn, of_rate_window, 1,
            CASE WHEN held IS NULL THEN '{}'
                 ELSE jsonb_build_object(held, jsonb_build_object('tokens', of_tokens, 'until', of_until)) END)
    ON CONFLICT (user_id, day) DO UPDATE SET
        turns = u.turns + EXCLUDED.turns,
        window_turns = CASE WHEN u.window_start = EXCLUDED.window_start THEN u.window_turns + 1 ELSE 1 END,
        window_start = EXCLUDED.window_start,
        reservations = engine.live_reservations(u.reservations, of_at) || EXCLUDED.reservations
    WHERE (of_rate = 0 OR u.window_start IS DISTINCT FROM EXCLUDED.window_start OR u.window_turns < of_rate)
      AND (of_budget = 0 OR u.tokens + engine.reserved(u.reservations, of_at) < of_budget)
    RETURNING held;
END
$$;

-- Provider calls (one element per call in each array) of one user on one UTC day: first their tokens on the
-- day's row (the row the daily budget reads), chat and dreaming apart (extraction and the deep pass are
-- dreaming: eros.store.usage.PURPOSES), then each call under its purpose and model (migration 0009). With
-- `reservation`, it settles: it removes that reservation from the day row in the same update that adds the real
-- tokens, and counts only while the row is there. A reservation implies the row (the admission made it), so a
-- missing row is an erasure that deleted it: an erased user gets no usage back from a request that was in
-- flight. With no calls, it only releases (a request that failed before paying). Without a reservation (no
-- budget, dreaming), it counts, and writes nothing to the day's row when the calls reported no tokens. Always
-- in that order: a turn locks its usage rows before its session's row, in the order open_turn_v2 takes them,
-- so that concurrent turns of one user cannot deadlock.
CREATE OR REPLACE FUNCTION engine.spend(of_user text, of_day date, purposes text[], models text[], inputs bigint[],
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
