-- 0015 — recall's statement lives in the database, so that a turn's recall reuses its plan (issue 14).
--
-- Until now eros.store.recall sent the ranking statement as text on every turn: ~7 KB of SQL, about forty CTEs
-- and subqueries, parsed, analysed and planned afresh each time because server-side prepared statements pin a
-- client to one database connection behind RDS Proxy (eros.db). On the bench's 1M-row data set that work was
-- ~2.3 ms of a ~6 ms recall (bench/results/turn_overhead.md), the largest single cost left in a turn.
-- PL/pgSQL caches the plan of each statement of a function in the backend that runs it; that cache is the
-- server's, not the client session's, so RDS Proxy sees an ordinary call and keeps multiplexing. So:
--
-- * engine.recall_layer()      one layer's ranked rows: the statement itself (what eros.store.recall documents).
-- * engine.recall_candidates() both layers' rows and the near-duplicates among them (a turn's recall).
-- * engine.turn_recall()       the same rows as recall_candidates(), through a PL/pgSQL body whose plan the
--                              backend keeps: what a turn calls.
--
-- The two statements are LANGUAGE sql, STABLE, with no SET clause and a single SELECT, so the planner inlines
-- them into the query that calls them: EXPLAIN of a call shows the whole plan (the benches and the partitioned
-- schema's test read it), and turn_recall's one statement is the whole recall, planned once per backend.
-- turn_recall forces the generic plan: the parameters only choose rows through the per-user indexes, which the
-- generic plan uses the same way for every user, and the custom plans the default mode tries first would each
-- be planned in full (the planner cannot tell that the knobs' CASEs or a layer's UNION ALL branch that a value
-- switches off cost nothing).
--
-- One statement serves every strategy, layer and setting: what used to be twelve statement texts picked in
-- Python is now decided by values. The score parts are CASEs on the strategy; the layer is a UNION ALL of two
-- branches whose condition on the layer parameter is a one-time filter (each branch keeps its index); the
-- demotion's pool is empty when the caller passes demote_pool 0 (demotion off, or the relationship layer);
-- the lexical part matches nothing when the caller passes no message (weights off, or nothing to match). The
-- rows, order and scores are exactly those of the statements they replace (tests/test_recall.py compares them
-- with a brute-force ranking in Python; tests/test_lexical_recall.py likewise).

-- Recall's knobs (eros.config.RecallParams), passed as one value. demote_pool 0 means no demotion.
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

-- One layer's top k rows (at most cap per category), ranked as eros.store.recall's docstring states (the
-- formulas of each strategy and the score parts). How the statement is built, and why:
-- * `base`, the rows a layer recalls. profile: the user's rows without an instance and with a category
--   (uncategorised profile rows are the raw turn dump the dreaming design replaced; the prompt renders the
--   profile by category, so such a row could never be shown), through companion_memories_profile_idx.
--   relationship: one user x one persona instance, through companion_memories_relationship_idx. In both, a
--   superseded row is history, kept but never recalled, and a row created after "now" did not exist yet then.
--   An exact scan of one user's rows: an ANN index could only serve ORDER BY distance, not these scores, and
--   filters by user only after its neighbour search (bench/recall_latency.py measures both).
--   It computes the distance (pgvector's <=>, the cost that matters) and the decay once per row: OFFSET 0
--   keeps it a plan node of its own, else the planner substitutes both expressions into every column that
--   reads them and computes them once per reference (~0.5 ms per statement at 100 rows). The age is clamped
--   at 0 (a row stamped a moment after the statement began is new) and the exponent at 700: exp() of a float8
--   below about -745 raises "underflow" instead of returning 0, and a memory many tau old must still be
--   recalled when it is the relevant one. A row without importance (utterances, rows from before extraction
--   gave one) weighs 0.5: neither promoted nor buried.
-- * The lexical part: BM25 of the message's lexemes against each row's (engine.lexemes, the same tokens on both
--   sides, migration 0012) over the layer's rows of this user only, so the inverse document frequency is the
--   user's own (a word all their memories have is worth nothing, their colleague's rare name a lot), divided
--   by the best row's so that it lies in [0, 1] whatever the message's length. Term frequency 1 and no length
--   normalisation (b = 0): memories are a sentence or two, a repeated word is no more evidence, and b = 0.75 was
--   no better on the dev set (bench/results/recall_summary.md).
--   `terms`: the message's lexemes, once (MATERIALIZED); none without a message, and then no row matches.
--   `matches`: (row, document frequency) per lexeme a row shares with the message; ts_delete() drops the
--   message's lexemes from a row's in C, so rows that match nothing (most) are never unnested, and the
--   frequency is a window over the matches, not a second pass and a join.
--   `bm25`: per row, the sum of idf = ln(1 + (n - df + 0.5) / (df + 0.5)) over its matched lexemes (BM25's
--   (k1 + 1) / (1 + k1) is 1 at term frequency 1 and b = 0); n is `collection`, MATERIALIZED so that it is
--   counted once, not once per match.
--   A row whose event time falls in a year the message names ("what happened in 2008?", "2018年") also gets
--   lexical_year_weight: the year is a word of the row too, but at a tie-breaker's weight it cannot lift the
--   one memory of 2008 over ten closer in meaning, and a year named in a question is rarely a coincidence.
-- * `scored`: the score parts and the score before demotion.
-- * The demotion (profile only): `pool` is the layer's demote_pool best rows before demotion, `demoted` those of
--   them with a newer row of the same category in the pool at least demote_similarity cosine-similar; they
--   lose demote_penalty. Comparing pool rows only bounds the pairwise work at pool^2 / 2 distances, whatever
--   the user's row count. `demoted` is MATERIALIZED: read twice, its pairwise join must run once.
-- * `capped` numbers each category's rows by score: the per-category quota of `grouped`, the optional cap of
--   the others (relationship rows have no category: one partition). ORDER BY score DESC, id ... LIMIT k is the
--   top k, ties broken by id so that the same rows always come back in the same order.
CREATE FUNCTION engine.recall_layer(
    of_layer text, of_user text, of_instance uuid, of_category text,
    query vector, message text, as_of timestamptz, knobs engine.recall_knobs, k int, cap int)
RETURNS TABLE (id uuid, content text, category text, importance real, created_at timestamptz, occurred_at date,
               occurred_precision text, embedding vector, distance float8, decay float8, similarity float8,
               recency_term float8, importance_term float8, lexical_term float8, demotion float8, score float8)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
WITH terms AS MATERIALIZED (
    SELECT coalesce(array_agg(lexeme), '{}') AS terms FROM unnest(engine.lexemes(message))
), base AS (
    SELECT m.id, m.content, m.category, m.importance, m.created_at, m.occurred_at, m.occurred_precision,
           m.embedding, m.lexemes,
           m.embedding <=> query AS distance,
           exp(-least(greatest(extract(epoch FROM (coalesce(as_of, statement_timestamp()) - t.event_time))::float8, 0)
                      / 86400.0 / (knobs).tau_days, 700)) AS decay,
           t.event_time
    FROM (SELECT id, content, category, importance, created_at, occurred_at, occurred_precision, embedding, lexemes,
                 superseded_at
          FROM engine.companion_memories
          WHERE of_layer = 'profile' AND user_id = of_user AND instance_id IS NULL AND category IS NOT NULL
            AND (of_category IS NULL OR category = of_category)
          UNION ALL
          SELECT id, content, category, importance, created_at, occurred_at, occurred_precision, embedding, lexemes,
                 superseded_at
          FROM engine.companion_memories
          WHERE of_layer = 'relationship' AND user_id = of_user AND instance_id = of_instance) m,
         LATERAL (SELECT coalesce(m.occurred_at::timestamp AT TIME ZONE 'UTC', m.created_at) AS event_time) t
    WHERE m.superseded_at IS NULL
      AND m.created_at <= coalesce(as_of, statement_timestamp())
    OFFSET 0
), matches AS (
    SELECT mt.id, count(*) OVER (PARTITION BY mt.lexeme)::float8 AS df
    FROM (SELECT b.id, unnest(tsvector_to_array(b.lexemes)) AS lexeme
          FROM base b, terms WHERE length(ts_delete(b.lexemes, terms.terms)) < length(b.lexemes)) mt, terms
    WHERE mt.lexeme = ANY (terms.terms)
), collection AS MATERIALIZED (
    SELECT count(*)::float8 AS n FROM base
), bm25 AS (
    SELECT matches.id, sum(ln(1 + (n - df + 0.5) / (df + 0.5))) AS raw FROM matches, collection GROUP BY matches.id
), lexical AS (
    SELECT bm25.id, raw / nullif(max(raw) OVER (), 0) AS lexical FROM bm25
), parts AS (
    SELECT b.*, terms.terms,
           coalesce(b.importance, 0.5)::float8 AS weight,
           (knobs).floor + (1 - (knobs).floor) * b.decay AS decay_factor,
           (knobs).lexical_weight * coalesce(l.lexical, 0)
               + CASE WHEN extract(year FROM b.occurred_at)::int::text = ANY (terms.terms)
                      THEN (knobs).lexical_year_weight ELSE 0::float8 END AS lexical_term
    FROM base b LEFT JOIN lexical l USING (id) CROSS JOIN terms
), scored AS (
    SELECT *,
           CASE (knobs).strategy
               WHEN 'grouped' THEN 1 - distance
               WHEN 'recency' THEN (1 - distance) + (knobs).lam * decay
               ELSE (1 - distance) * decay_factor
                    * ((knobs).importance_floor + (1 - (knobs).importance_floor) * weight) END
             + (knobs).importance_weight * weight + lexical_term AS undemoted,
           CASE (knobs).strategy
               WHEN 'grouped' THEN 0::float8
               WHEN 'recency' THEN (knobs).lam * decay
               ELSE (1 - distance) * decay_factor - (1 - distance) END AS recency_term,
           CASE (knobs).strategy
               WHEN 'composite' THEN (1 - distance) * decay_factor
                                     * ((knobs).importance_floor + (1 - (knobs).importance_floor) * weight - 1)
                                     + (knobs).importance_weight * weight
               ELSE (knobs).importance_weight * weight END AS importance_term
    FROM parts
), pool AS (
    SELECT scored.id, scored.category, scored.event_time, scored.embedding FROM scored
    ORDER BY undemoted DESC, scored.id
    LIMIT CASE WHEN of_layer = 'profile' THEN (knobs).demote_pool ELSE 0 END
), demoted AS MATERIALIZED (
    SELECT a.id FROM pool a
    WHERE EXISTS (SELECT 1 FROM pool b
                  WHERE b.category = a.category AND b.event_time > a.event_time
                    AND 1 - (a.embedding <=> b.embedding) >= (knobs).demote_similarity)
), ranked AS (
    SELECT *, undemoted - demotion AS score
    FROM (SELECT *, CASE WHEN scored.id IN (SELECT demoted.id FROM demoted) THEN (knobs).demote_penalty
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
WHERE category_rank <= cap
ORDER BY score DESC, capped.id
LIMIT k
$$;

-- A row of a turn's recall (eros.store.rows.RecallCandidate): what both functions below return.
CREATE TYPE engine.recall_candidate AS (
    layer text, id uuid, content text, category text, importance real, created_at timestamptz, occurred_at date,
    occurred_precision text, distance float8, decay float8, similarity float8, recency_term float8,
    importance_term float8, lexical_term float8, demotion float8, score float8, near uuid[]
);

-- Both layers, as a turn recalls them: the profile's top profile_k (at most profile_cap per category), then the
-- relationship layer's top relationship_k of the instance, each exactly as recall_layer() ranks it, without
-- embeddings, each with `near`: the rows placed before it (the profile's first, each layer by score) at least
-- `dedupe` cosine-similar to it. A row is a near-duplicate of what the prompt already carries exactly when one
-- of those was kept (eros.recall.Hygiene), so no vector leaves the database: at most (k + relationship_k)^2 / 2
-- distances in C instead of dot products in Python over 60 KB of shipped vectors.
CREATE FUNCTION engine.recall_candidates(
    of_user text, of_instance uuid, query vector, message text, as_of timestamptz, knobs engine.recall_knobs,
    profile_k int, profile_cap int, relationship_k int, dedupe float8)
RETURNS SETOF engine.recall_candidate
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
WITH profile AS MATERIALIZED (
    SELECT * FROM engine.recall_layer('profile', of_user, NULL, NULL, query, message, as_of, knobs,
                                      profile_k, profile_cap)
), relationship AS MATERIALIZED (
    SELECT * FROM engine.recall_layer('relationship', of_user, of_instance, NULL, query, message, as_of, knobs,
                                      relationship_k, relationship_k)
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
             WHERE b.place < c.place AND 1 - (b.embedding <=> c.embedding) >= dedupe
             ORDER BY b.place) AS near
FROM candidates c
ORDER BY c.place
$$;

-- What a turn calls: recall_candidates() through PL/pgSQL, whose one statement the backend plans once (generic
-- plan, see the top) and then only executes. Same arguments, same rows.
CREATE FUNCTION engine.turn_recall(
    of_user text, of_instance uuid, query vector, message text, as_of timestamptz, knobs engine.recall_knobs,
    profile_k int, profile_cap int, relationship_k int, dedupe float8)
RETURNS SETOF engine.recall_candidate
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY SELECT * FROM engine.recall_candidates(of_user, of_instance, query, message, as_of, knobs,
                                                        profile_k, profile_cap, relationship_k, dedupe);
END
$$;
