-- Recall: a turn's recall statement and its parts, in the database (current definitions; README.md here says
-- how this file is applied and what a changed signature must do). Created by migration 0015, which says why the
-- statement moved out of Python: PL/pgSQL caches the plan of each statement of a function in the backend that
-- runs it, invisible to RDS Proxy, so a turn's recall is planned once per backend instead of on every turn.
--
-- * engine.recall_layer_v2()      one layer's ranked rows: the statement itself (its formulas and what it reads
--                                 are written above it), with engine.recall_older_v2(), its lexical path.
-- * engine.recall_candidates_v2() both layers' rows and the near-duplicates among them (a turn's recall).
-- * engine.turn_recall_v3()       the same rows as recall_candidates_v2(), through a PL/pgSQL body whose plan the
--                                 backend keeps: what a turn calls.
-- (_v2: migration 0023's bound added three knobs, so the knobs' type and the functions that take it have new
-- names; the previous release's engine.recall_layer, recall_candidates and turn_recall stay in the databases
-- they were created in until a later migration drops them: README.md, the _v2 rule.)
--
-- The two statements are LANGUAGE sql, STABLE, with no SET clause and a single SELECT, so the planner inlines
-- them into the query that calls them: EXPLAIN of a call shows the whole plan (the benches and the partitioned
-- schema's test read it), and turn_recall_v3's one statement is the whole recall, planned once per backend.
-- turn_recall_v3 forces the generic plan: the parameters only choose rows through the per-user indexes, which the
-- generic plan uses the same way for every user, and the custom plans the default mode tries first would each
-- be planned in full (the planner cannot tell that the knobs' CASEs or a layer's UNION ALL branch that a value
-- switches off cost nothing).
--
-- One statement serves every strategy, layer and setting: the score parts are CASEs on the strategy; the layer
-- is a UNION ALL of two branches whose condition on the layer parameter is a one-time filter (each branch keeps
-- its index); the demotion's pool is empty when the caller passes demote_pool 0 (demotion off, or the
-- relationship layer); the lexical part matches nothing when the caller passes no message (weights off, or
-- nothing to match). tests/test_recall.py compares the rows, order and scores with a brute-force ranking in
-- Python; tests/test_lexical_recall.py likewise.
--
-- The types are created when missing and never changed in place (a type's fields are its signature: a
-- change is a new type, README.md).

-- The previous release's knobs: the functions it called (engine.recall_layer, recall_candidates, turn_recall) take
-- them, and stay defined until a later migration drops them (README.md, the _v2 rule).
DO $do$ BEGIN
    CREATE TYPE engine.recall_knobs AS (
        strategy            text,    -- grouped | recency | composite
        lam                 float8,  -- recency: weight of the decay
        tau_days            float8,  -- decay = exp(-age_days / tau_days)
        floor               float8,  -- composite: what a very old row keeps of its decay
        importance_floor    float8,  -- composite: what the least important row keeps
        importance_weight   float8,  -- the additive importance term, every strategy
        demote_similarity   float8,
        demote_penalty      float8,
        demote_pool         int,     -- 0: the demotion is off
        lexical_weight      float8,
        lexical_year_weight float8
    );
EXCEPTION WHEN duplicate_object THEN NULL;  -- it exists: a type is never changed in place
END $do$;

-- Recall's knobs (eros.config.RecallKnobs), passed as one value: the previous release's fields, then the bound's.
-- demote_pool 0 means no demotion; utterance_window 0 means no bound (the exact scan of every row).
DO $do$ BEGIN
    CREATE TYPE engine.recall_knobs_v2 AS (
        strategy            text,    -- grouped | recency | composite
        lam                 float8,  -- recency: weight of the decay
        tau_days            float8,  -- decay = exp(-age_days / tau_days)
        floor               float8,  -- composite: what a very old row keeps of its decay
        importance_floor    float8,  -- composite: what the least important row keeps
        importance_weight   float8,  -- the additive importance term, every strategy
        demote_similarity   float8,
        demote_penalty      float8,
        demote_pool         int,     -- 0: the demotion is off
        lexical_weight      float8,
        lexical_year_weight float8,
        utterance_window    int,     -- the newest utterances scored; 0: no bound, every row exactly
        sign_pool           int,     -- RECALL_POOL: of a layer, the best k + this many get the lexical part
        lexical_pool        int      -- at most this many older rows found by a rare word of the message
    );
EXCEPTION WHEN duplicate_object THEN NULL;  -- it exists: a type is never changed in place
END $do$;

-- A row's score before demotion, from its parts (the formulas below): one definition for the rough score that
-- picks a layer's pool (engine.recall_rough_v2, below) and for the score the pool is ranked by. Inlined by the
-- planner.
CREATE OR REPLACE FUNCTION engine.recall_score_v2(
    of_knobs engine.recall_knobs_v2, of_similarity float8, of_decay float8, of_weight float8, of_lexical float8)
RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE (of_knobs).strategy
           WHEN 'grouped' THEN of_similarity
           WHEN 'recency' THEN of_similarity + (of_knobs).lam * of_decay
           ELSE of_similarity * ((of_knobs).floor + (1 - (of_knobs).floor) * of_decay)
                * ((of_knobs).importance_floor + (1 - (of_knobs).importance_floor) * of_weight) END
       + (of_knobs).importance_weight * of_weight + of_lexical;

-- A candidate's rough score: its score from what an index gives (distance, decay, importance), without the
-- lexical part and the demotion, by which each layer's pool is chosen (recall_layer_v2: `profile`,
-- `relationship`). A row without importance (an utterance, a row from before extraction gave one) weighs 0.5:
-- neither promoted nor buried. Inlined by the planner.
CREATE OR REPLACE FUNCTION engine.recall_rough_v2(
    of_knobs engine.recall_knobs_v2, of_distance float8, of_decay float8, of_importance real)
RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN engine.recall_score_v2(of_knobs, 1 - of_distance, of_decay, coalesce(of_importance, 0.5)::float8, 0);

-- A row's decay, exp(-age / tau_days), age from its event time to as_of: clamped at 0 (a row stamped a moment after
-- the statement began is new) and the exponent at 700 (exp() of a float8 below about -745 raises "underflow"
-- instead of returning 0, and a memory many tau old must still be recalled when it is the relevant one). The
-- event time is occurred_at when a session said when it happened, else created_at. Inlined by the planner.
CREATE OR REPLACE FUNCTION engine.recall_decay_v2(
    of_knobs engine.recall_knobs_v2, of_as_of timestamptz, of_occurred_at date, of_created_at timestamptz)
RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN exp(-least(greatest(date_part('epoch', of_as_of - coalesce(of_occurred_at::timestamp AT TIME ZONE 'UTC',
                                                                   of_created_at)), 0)
                  / 86400.0 / (of_knobs).tau_days, 700));

-- The lexemes of a row that are among of_terms (a message's): the row's lexemes less those that are not, in C
-- (ts_delete twice), instead of unnesting every lexeme of the row to compare it with the terms. Inlined by the
-- planner.
CREATE OR REPLACE FUNCTION engine.lexemes_among(of_lexemes tsvector, of_terms text[])
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN tsvector_to_array(ts_delete(of_lexemes, tsvector_to_array(ts_delete(of_lexemes, of_terms))));

-- The lexical path of recall_layer_v2 (below, `older`): of the instance's rows older than of_before (the oldest
-- row of the window), those that hold the most of of_keys (the message's words that are rare in the window,
-- hashed with the instance as engine.instance_terms() keys them), then the newest, at most of_limit. Each word's
-- newest 10 * of_limit rows before the window are read from engine.relationship_terms (migration 0027), in its
-- index's order: at most that many index entries a word (~40 bytes each), whatever the history's length or how
-- often the word was said long ago. (With of_limit alone, a word said every hundred utterances reached back only
-- ~5,000 utterances, and the row that also held two rarer words was found through none of them:
-- bench/results/long_history_eval_scripted_50k.md notes.) A Chinese message's words are its character pairs, and
-- "那个" or "上次" may be absent from the window yet said in every other old row: the row that also holds "红烧"
-- and "烧肉" is the one asked about.
-- The caller reads the rows, drops a superseded one and one that holds none of of_terms (a hash collision).
-- of_instance and of_terms are not read here (the keys carry the instance); they stay for the _v2 rule
-- (README.md). LANGUAGE sql and a single SELECT: the planner inlines it into the recall statement.
CREATE OR REPLACE FUNCTION engine.recall_older_v2(
    of_user text, of_instance uuid, of_terms text[], of_keys bigint[], of_as_of timestamptz, of_before timestamptz,
    of_limit int)
RETURNS SETOF uuid
LANGUAGE sql STABLE PARALLEL SAFE ROWS 50
AS $$
SELECT p.memory_id
FROM (SELECT DISTINCT k FROM unnest(of_keys) AS k) AS w(term_key),
     LATERAL (SELECT r.memory_id, r.created_at FROM engine.relationship_terms r
              WHERE r.term_key = w.term_key AND r.user_id = of_user
                AND r.created_at < of_before AND r.created_at <= coalesce(of_as_of, statement_timestamp())
              ORDER BY r.created_at DESC
              LIMIT 10 * of_limit) AS p
GROUP BY p.memory_id
ORDER BY count(*) DESC, max(p.created_at) DESC, p.memory_id
LIMIT of_limit
$$;

-- One layer's top k rows (at most cap per category), by
--
--     score = base + importance_term + lexical_term - demotion
--
-- where s = 1 - (embedding <=> query) is the cosine similarity, d = exp(-age / tau_days) the decay (age from the
-- row's event time, occurred_at when a session said when it happened, else created_at, to as_of), and base is
-- the strategy's:
--     grouped    s                                       (nearest first; cap is the per-category quota)
--     recency    s + lam * d                             (a global top k, optional per-category cap)
--     composite  s * (floor + (1 - floor) * d) * (importance_floor + (1 - importance_floor) * importance)
-- importance_term = importance_weight * coalesce(importance, 0.5): a small additive term that breaks near-ties
-- toward the important row without multiplying relevance away (on a compressed cosine scale such as e5's, a
-- multiplier lets an important but unrelated row win every query; that is also why composite has
-- importance_floor, as floor is what a very old but still-true row, "has a daughter", keeps of its decay:
-- bench/results/recall_eval_e5.md). lexical_term = lexical_weight * (BM25 scaled to [0, 1]) + lexical_year_weight
-- when the message names the year of the row's event time (below). demotion is the read-time safety net of
-- consolidation (below). Each row comes back with its parts, similarity + recency_term + importance_term +
-- lexical_term - demotion = score (for composite, recency_term = s * decay factor - s, and the importance term
-- includes s * decay factor * (importance factor - 1)), so a caller can show why a row ranked. The knobs and
-- their defaults: eros.config.RecallKnobs.
--
-- What it reads: a bounded candidate set (issue 27), whatever the length of the history. The relationship layer
-- grows by one utterance a turn, and an exact scan of it cost ~15 µs a row (1.45 s at 100,000:
-- bench/results/recall_latency_10m.md); docs/CAPACITY.md has the measurements of this bound.
-- * `profile`: the user's active rows without an instance and with a category (uncategorised profile rows are
--   the raw turn dump the dreaming design replaced; the prompt renders the profile by category, so such a row
--   could never be shown). Consolidation keeps it small (~100 rows; 2,000 is the measured large case), so all of
--   them are candidates, read one category at a time (`categories`: the five the CHECK allows, written out; a
--   category the user has no row of costs one index probe, where reading the user's categories from the index
--   read every entry with its vector, a second pass over the profile: ~2 ms at 2,000 rows). A small profile
--   (`sized`: at most 300 rows, most users') is read from the table instead, by key, its ids from a slim index
--   (migration 0028 says why: a small user's turn then keeps only the table's copy of its vectors in memory);
--   the pool's rows are read again below, from memory by then.
-- * `recent`, the relationship layer's window: the instance's newest utterance_window active rows other than
--   episodes. Older utterances stay stored, listed, exported and erased; they leave only this vector part of
--   recall, and are reached by
-- * `episodes`: the instance's newest utterance_window active episodes (one per session, migration 0021: a
--   window of 1,000 utterances is ~50 sessions, 1,000 episodes ~20,000 utterances);
-- * `older`, the lexical path (engine.recall_older_v2, above): older rows of the instance that hold words of the
--   message that are rare in the window, at most lexical_pool. "Rare" (`rare`): held by at most 1 in 100 of the
--   relationship rows since the window's oldest (`span`), counted in engine.relationship_terms' index, at most
--   utterance_window / 100 + 1 entries a word (migration 0027). A name, a place or a number said once a year ago
--   is rare; "I" and "today" are in most rows and say nothing (BM25 would give them ~no weight). A history
--   imported all at once has no episodes yet, and this is what still finds its old facts. Only when the window
--   is full: a shorter conversation is in the window whole.
-- * With utterance_window 0 there is no bound: `recent` is every active row of the instance, episodes included,
--   and every candidate goes through every part below (the statement of the previous release, what an
--   evaluation compares the bound with).
-- Each candidate is read from an index alone, with its vector (migration 0025: the profile, window and episodes
-- indexes INCLUDE the columns read here): a user's rows sit together in the index, where the heap scatters them
-- over a page each, and no row's text or lexemes are read. Each gets its exact score but for the lexical part and
-- the demotion, `rough` (engine.recall_rough_v2): from its exact distance (the vector is used there and dropped),
-- its decay (engine.recall_decay_v2) and its importance. Then, per layer:
-- * `chosen`, the pool: the best k + pool rows by `rough` (of the profile: of each category's best cap + pool;
--   demote_pool instead of pool when that is more), plus the lexical path's rows. The two parts left can only move
--   a row by their size: the lexical part adds at most lexical_weight + lexical_year_weight, the demotion takes
--   demote_penalty from rows of its own pool. So the pool is the exact top k unless a row below it gains more than
--   the gap to the k-th; `pool` 0 takes only the rough top k, whose order the two parts may still change.
--   (Migration 0023's first form picked 400 rows per layer by a sign-bit estimate of the cosine, `signs`, and read
--   each from the table: on e5 vectors that kept 86 % of the exact top 10, bench/recall_prefilter.py, and an exact
--   distance read from an index costs about what the popcount did: bench/results/turn_overhead_long_history.md.)
-- * `base`: the pool's rows from the table by primary key (text, lexemes, the vector for the demotion and the
--   near-duplicates): k + pool rows, whatever the user's size.
-- * The lexical part: BM25 of the message's lexemes against each pool row's (engine.lexemes, the same tokens on
--   both sides, migration 0012), with the document frequencies of the pool, so the inverse document frequency
--   is among the rows in contention (a word all of them hold is worth nothing there, a rare name a lot) and its
--   counts are bounded like the rest; divided by the best row's so that it lies in [0, 1] whatever the
--   message's length. Term frequency 1 and no length normalisation (b = 0): memories are a sentence or two,
--   a repeated word is no more evidence, and b = 0.75 was no better on the dev set
--   (bench/results/recall_summary.md). A layer no larger than its pool (a small user) is scored exactly as
--   before the bound, document frequencies over the whole layer.
--   `terms`: the message's lexemes, once (MATERIALIZED); no lexemes without a message, and then no row matches.
--   `matched` (in `base`): the message's lexemes a row holds (engine.lexemes_among, in C; NULL when none).
--   `frequencies`: each such lexeme's
--   document frequency over the pool (one small row per lexeme of the message, MATERIALIZED).
--   `bm25`: per row, the sum of idf = ln(1 + (n - df + 0.5) / (df + 0.5)) over its matched lexemes (BM25's
--   (k1 + 1) / (1 + k1) is 1 at term frequency 1 and b = 0); n is `collection`, MATERIALIZED so that it is
--   counted once. Each row looks its lexemes up in the few `frequencies` rows instead of joining a per-row
--   result back to the pool (a plan made without the values chose a nested loop over that join).
--   A row whose event time falls in a year the message names ("what happened in 2008?", "2018年") also gets
--   lexical_year_weight: the year is a word of the row too, but at a tie-breaker's weight it cannot lift the
--   one memory of 2008 over ten closer in meaning, and a year named in a question is rarely a coincidence.
-- * `scored`: the score parts and the score before demotion.
-- * The demotion (profile only): `contenders` is the layer's demote_pool best rows before demotion, `demoted`
--   those of them with a newer row of the same category among them at least demote_similarity cosine-similar;
--   they lose demote_penalty. Comparing those rows only bounds the pairwise work at demote_pool^2 / 2 distances,
--   whatever the user's row count. `demoted` is MATERIALIZED: read twice, its pairwise join must run once.
-- * `capped` numbers each category's rows by score: the per-category quota of `grouped`, the optional cap of
--   the others (relationship rows have no category: one partition). ORDER BY score DESC, id ... LIMIT k is the
--   top k, ties broken by id so that the same rows always come back in the same order.
-- of_query_signs is no longer read (the pool is chosen by exact distances); it stays in the signature so that
-- both releases call the function the same way during a deploy (README.md, the _v2 rule).
CREATE OR REPLACE FUNCTION engine.recall_layer_v2(
    of_layer text, of_user text, of_instance uuid, of_category text, of_query vector, of_query_signs bit(512),
    of_message text, of_as_of timestamptz, of_knobs engine.recall_knobs_v2, of_k int, of_cap int)
RETURNS TABLE (id uuid, content text, category text, importance real, created_at timestamptz, occurred_at date,
               occurred_precision text, embedding vector, distance float8, decay float8, similarity float8,
               recency_term float8, importance_term float8, lexical_term float8, demotion float8, score float8)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
WITH terms AS MATERIALIZED (
    SELECT coalesce(array_agg(lexeme), '{}') AS terms, coalesce(of_as_of, statement_timestamp()) AS as_of,
           (of_knobs).utterance_window > 0 AS bounded,
           CASE WHEN (of_knobs).utterance_window > 0  -- the pool beyond k (or cap): none without the bound
                THEN greatest((of_knobs).sign_pool, (of_knobs).demote_pool) END AS pool
    FROM unnest(engine.lexemes(of_message))
), categories AS (  -- the CHECK of migration 0001 (eros.memory.CATEGORIES); tests/test_recall.py compares them
    SELECT c.category FROM unnest(ARRAY['fact', 'preference', 'event', 'emotion', 'relation']) AS c(category)
    WHERE of_layer = 'profile' AND (of_category IS NULL OR c.category = of_category)
), sized AS MATERIALIZED (  -- the ids of a small profile (at most 300 rows), from the slim index (migration 0028)
    SELECT CASE WHEN count(*) <= 300 THEN array_agg(n.id) END AS small
    FROM (SELECT c.id FROM engine.companion_memories c
          WHERE of_layer = 'profile' AND c.user_id = of_user AND c.instance_id IS NULL AND c.superseded_at IS NULL
            AND c.category IS NOT NULL
          LIMIT 301) AS n
), profile AS (
    SELECT p.* FROM categories, terms, sized, LATERAL (
        SELECT r.*, engine.recall_rough_v2(of_knobs, r.distance, r.decay, r.importance) AS rough
        FROM (SELECT c.id, c.category, c.importance, c.created_at, c.occurred_at,
                     c.embedding <=> of_query AS distance,
                     engine.recall_decay_v2(of_knobs, terms.as_of, c.occurred_at, c.created_at) AS decay
              FROM engine.companion_memories c
              WHERE c.user_id = of_user AND c.instance_id IS NULL AND c.category = categories.category
                AND c.superseded_at IS NULL AND c.created_at <= terms.as_of
              OFFSET 0) r  -- a node of its own: else the planner copies the distance into every use of it
        ORDER BY rough DESC, r.id
        LIMIT of_cap + terms.pool
    ) p
    WHERE sized.small IS NULL
    UNION ALL
    SELECT s.id, s.category, s.importance, s.created_at, s.occurred_at, s.distance, s.decay, s.rough
    FROM terms, (
        SELECT r.*, row_number() OVER (PARTITION BY r.category ORDER BY r.rough DESC, r.id) AS place
        FROM (SELECT q.*, engine.recall_rough_v2(of_knobs, q.distance, q.decay, q.importance) AS rough
              FROM (SELECT c.id, c.category, c.importance, c.created_at, c.occurred_at,
                           c.embedding <=> of_query AS distance,
                           engine.recall_decay_v2(of_knobs, terms.as_of, c.occurred_at, c.created_at) AS decay
                    FROM sized, terms, unnest(sized.small) AS i(id),
                         LATERAL (SELECT m.* FROM engine.companion_memories m  -- by primary key, from the table
                                  WHERE m.id = i.id AND m.user_id = of_user) c
                    WHERE (of_category IS NULL OR c.category = of_category) AND c.created_at <= terms.as_of
                    OFFSET 0) q) r
    ) s
    WHERE s.place <= of_cap + terms.pool OR terms.pool IS NULL
), recent AS MATERIALIZED (
    SELECT m.id, NULL::text AS category, m.importance, m.created_at, m.occurred_at,
           m.embedding <=> of_query AS distance
    FROM engine.companion_memories m
    WHERE of_layer = 'relationship' AND m.user_id = of_user AND m.instance_id = of_instance
      AND m.superseded_at IS NULL AND m.created_at <= coalesce(of_as_of, statement_timestamp())
      AND (m.source <> 'episode' OR (of_knobs).utterance_window = 0)
    ORDER BY m.created_at DESC
    LIMIT nullif((of_knobs).utterance_window, 0)
), episodes AS MATERIALIZED (
    SELECT m.id, NULL::text AS category, m.importance, m.created_at, m.occurred_at,
           m.embedding <=> of_query AS distance
    FROM engine.companion_memories m
    WHERE of_layer = 'relationship' AND (of_knobs).utterance_window > 0 AND m.user_id = of_user
      AND m.instance_id = of_instance AND m.source = 'episode' AND m.superseded_at IS NULL
      AND m.created_at <= coalesce(of_as_of, statement_timestamp())
    ORDER BY m.created_at DESC
    LIMIT (of_knobs).utterance_window
), span AS MATERIALIZED (  -- the window's oldest row, and whether the window is full (else it holds every row)
    SELECT min(recent.created_at) AS since, count(*) >= (of_knobs).utterance_window AS full FROM recent
), rare AS MATERIALIZED (
    SELECT array_agg(k.term) AS terms, array_agg(k.term_key) AS keys, span.since AS before
    FROM terms, span,
         LATERAL (SELECT t.term, (engine.instance_terms(of_instance, array_to_tsvector(ARRAY[t.term])))[1] AS term_key
                  FROM unnest(terms.terms) AS t(term)) k
    WHERE of_layer = 'relationship' AND terms.bounded AND span.full
      AND (SELECT count(*) FROM (SELECT FROM engine.relationship_terms r  -- held by at most 1 in 100 of the window
                                 WHERE r.term_key = k.term_key AND r.user_id = of_user
                                   AND r.created_at >= span.since AND r.created_at <= terms.as_of
                                 LIMIT (of_knobs).utterance_window / 100 + 1) AS held)
          <= (of_knobs).utterance_window / 100
    GROUP BY span.since
    HAVING count(*) > 0  -- no row, and no call of the lexical path, when no word is rare or the window holds all
), older AS MATERIALIZED (
    SELECT m.id, NULL::text AS category, m.importance, m.created_at, m.occurred_at,
           m.embedding <=> of_query AS distance
    FROM rare,
         engine.recall_older_v2(of_user, of_instance, rare.terms, rare.keys, of_as_of, rare.before,
                                (of_knobs).lexical_pool) AS o(id),
         LATERAL (SELECT c.* FROM engine.companion_memories c WHERE c.id = o.id AND c.user_id = of_user) m
    WHERE m.superseded_at IS NULL AND engine.lexemes_among(m.lexemes, rare.terms) <> '{}'
      AND o.id NOT IN (SELECT e.id FROM episodes e)  -- a hashed set: NOT EXISTS became a loop over the episodes
), relationship AS (
    SELECT r.*, engine.recall_rough_v2(of_knobs, r.distance, r.decay, r.importance) AS rough
    FROM (SELECT u.*, engine.recall_decay_v2(of_knobs, terms.as_of, u.occurred_at, u.created_at) AS decay
          FROM (SELECT * FROM recent UNION ALL SELECT * FROM episodes) u, terms) r
), chosen AS (
    (SELECT p.id, p.category, p.importance, p.created_at, p.occurred_at, p.distance, p.decay FROM profile p
     ORDER BY p.rough DESC, p.id
     LIMIT of_k + (SELECT pool FROM terms))
    UNION ALL
    (SELECT r.id, r.category, r.importance, r.created_at, r.occurred_at, r.distance, r.decay FROM relationship r
     ORDER BY r.rough DESC, r.id
     LIMIT of_k + (SELECT pool FROM terms))
    UNION ALL
    SELECT o.id, o.category, o.importance, o.created_at, o.occurred_at, o.distance,  -- the lexical path's rows: the
           engine.recall_decay_v2(of_knobs, terms.as_of, o.occurred_at, o.created_at)  -- lexical part decides them
    FROM older o, terms
), base AS (
    SELECT c.id, m.content, c.category, c.importance, c.created_at, c.occurred_at, m.occurred_precision,
           m.embedding, c.distance, coalesce(c.occurred_at::timestamp AT TIME ZONE 'UTC', c.created_at) AS event_time,
           c.decay,
           nullif(engine.lexemes_among(m.lexemes, terms.terms), '{}') AS matched
    FROM chosen c, terms,
         LATERAL (SELECT r.content, r.occurred_precision, r.embedding, r.lexemes FROM engine.companion_memories r
                  WHERE r.id = c.id AND r.user_id = of_user) m  -- by primary key
    OFFSET 0
), frequencies AS MATERIALIZED (
    SELECT lexeme, count(*)::float8 AS df FROM base, unnest(base.matched) AS lexeme GROUP BY lexeme
), collection AS MATERIALIZED (
    SELECT count(*)::float8 AS n FROM base
), bm25 AS (
    SELECT b.*, CASE WHEN b.matched IS NOT NULL
                     THEN (SELECT sum(ln(1 + (c.n - f.df + 0.5) / (f.df + 0.5)))
                           FROM frequencies f, collection c WHERE f.lexeme = ANY (b.matched)) END AS raw
    FROM base b
), parts AS (
    SELECT b.*, coalesce(b.importance, 0.5)::float8 AS weight,
           (of_knobs).floor + (1 - (of_knobs).floor) * b.decay AS decay_factor,
           (of_knobs).lexical_weight * coalesce(b.raw / nullif(max(b.raw) OVER (), 0), 0)
               + CASE WHEN extract(year FROM b.occurred_at)::int::text = ANY (terms.terms)
                      THEN (of_knobs).lexical_year_weight ELSE 0::float8 END AS lexical_term
    FROM bm25 b, terms
), scored AS (
    SELECT *,
           engine.recall_score_v2(of_knobs, 1 - distance, decay, weight, lexical_term) AS undemoted,
           CASE (of_knobs).strategy
               WHEN 'grouped' THEN 0::float8
               WHEN 'recency' THEN (of_knobs).lam * decay
               ELSE (1 - distance) * decay_factor - (1 - distance) END AS recency_term,
           CASE (of_knobs).strategy
               WHEN 'composite' THEN (1 - distance) * decay_factor
                                     * ((of_knobs).importance_floor + (1 - (of_knobs).importance_floor) * weight - 1)
                                     + (of_knobs).importance_weight * weight
               ELSE (of_knobs).importance_weight * weight END AS importance_term
    FROM parts
), contenders AS (
    SELECT scored.id, scored.category, scored.event_time, scored.embedding FROM scored
    ORDER BY undemoted DESC, scored.id
    LIMIT CASE WHEN of_layer = 'profile' THEN (of_knobs).demote_pool ELSE 0 END
), demoted AS MATERIALIZED (
    SELECT a.id FROM contenders a
    WHERE EXISTS (SELECT 1 FROM contenders b
                  WHERE b.category = a.category AND b.event_time > a.event_time
                    AND 1 - (a.embedding <=> b.embedding) >= (of_knobs).demote_similarity)
), ranked AS (
    SELECT *, undemoted - demotion AS score
    FROM (SELECT *, CASE WHEN scored.id IN (SELECT demoted.id FROM demoted) THEN (of_knobs).demote_penalty
                         ELSE 0::float8 END AS demotion
          FROM scored) d
), capped AS (
    SELECT *, row_number() OVER (PARTITION BY ranked.category ORDER BY score DESC, ranked.id) AS category_rank
    FROM ranked
)
SELECT capped.id, capped.content, capped.category, capped.importance, capped.created_at, capped.occurred_at,
       capped.occurred_precision, capped.embedding, distance, decay, 1 - distance AS similarity, recency_term,
       importance_term, lexical_term, demotion, score
FROM capped
WHERE category_rank <= of_cap
ORDER BY score DESC, capped.id
LIMIT of_k
$$;

-- A row of a turn's recall (eros.store.rows.RecallCandidate): what both functions below return.
DO $do$ BEGIN
    CREATE TYPE engine.recall_candidate AS (
        layer text, id uuid, content text, category text, importance real, created_at timestamptz, occurred_at date,
        occurred_precision text, distance float8, decay float8, similarity float8, recency_term float8,
        importance_term float8, lexical_term float8, demotion float8, score float8, near uuid[]
    );
EXCEPTION WHEN duplicate_object THEN NULL;  -- it exists: a type is never changed in place
END $do$;

-- Both layers, as a turn recalls them: the profile's top profile_k (at most profile_cap per category), then the
-- relationship layer's top relationship_k of the instance, each exactly as recall_layer_v2() ranks it, without
-- embeddings, each with `near`: the rows placed before it (the profile's first, each layer by score) at least
-- `dedupe` cosine-similar to it. A row is a near-duplicate of what the prompt already carries exactly when one
-- of those was kept (eros.recall.Hygiene), so no vector leaves the database: at most (k + relationship_k)^2 / 2
-- distances in C instead of dot products in Python over 60 KB of shipped vectors.
CREATE OR REPLACE FUNCTION engine.recall_candidates_v2(
    of_user text, of_instance uuid, of_query vector, of_query_signs bit(512), of_message text, of_as_of timestamptz,
    of_knobs engine.recall_knobs_v2, of_profile_k int, of_profile_cap int, of_relationship_k int, of_dedupe float8)
RETURNS SETOF engine.recall_candidate
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
WITH profile AS MATERIALIZED (
    SELECT * FROM engine.recall_layer_v2('profile', of_user, NULL, NULL, of_query, of_query_signs, of_message,
                                         of_as_of, of_knobs, of_profile_k, of_profile_cap)
), relationship AS MATERIALIZED (
    SELECT * FROM engine.recall_layer_v2('relationship', of_user, of_instance, NULL, of_query, of_query_signs,
                                         of_message, of_as_of, of_knobs, of_relationship_k, of_relationship_k)
), candidates AS (
    SELECT 'profile' AS layer, row_number() OVER (ORDER BY profile.score DESC, profile.id) AS place, * FROM profile
    UNION ALL
    SELECT 'relationship', (SELECT count(*) FROM profile)
                           + row_number() OVER (ORDER BY relationship.score DESC, relationship.id), *
    FROM relationship
)
SELECT c.layer, c.id, c.content, c.category, c.importance, c.created_at, c.occurred_at, c.occurred_precision,
       c.distance, c.decay, c.similarity, c.recency_term, c.importance_term, c.lexical_term, c.demotion, c.score,
       ARRAY(SELECT b.id FROM candidates b
             WHERE b.place < c.place AND 1 - (b.embedding <=> c.embedding) >= of_dedupe
             ORDER BY b.place) AS near
FROM candidates c
ORDER BY c.place
$$;

-- What a turn calls: recall_candidates_v2() through PL/pgSQL, whose one statement the backend plans once (generic
-- plan, see the top) and then only executes. Same arguments, same rows, and of_model, the model that embedded
-- of_query: refused first (engine.embedded_with, SQLSTATE EM001, a retryable 503) when the stored vectors are of
-- another model, so that a container which has not yet seen a re-embedding's switch (it asks again within a second)
-- never ranks by comparing two models' vectors (_v3: of_model is a new argument; turn_recall_v2, without it, stays
-- in the databases it was created in for the previous release's containers, README.md's _v2 rule).
CREATE OR REPLACE FUNCTION engine.turn_recall_v3(
    of_user text, of_instance uuid, of_query vector, of_query_signs bit(512), of_message text, of_as_of timestamptz,
    of_knobs engine.recall_knobs_v2, of_profile_k int, of_profile_cap int, of_relationship_k int, of_dedupe float8,
    of_model text)
RETURNS SETOF engine.recall_candidate
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM engine.embedded_with(of_model);
    RETURN QUERY SELECT * FROM engine.recall_candidates_v2(of_user, of_instance, of_query, of_query_signs,
                                                           of_message, of_as_of,
                                                           of_knobs, of_profile_k, of_profile_cap,
                                                           of_relationship_k, of_dedupe);
END
$$;
