-- 0014 — engine.lexemes() in time linear in the text's length, with the same result (issue 14).
--
-- 0012's definition took each character pair with substr(body, i, 2) for every i. On UTF-8 text substr walks
-- from the start of the string, so the pairs cost O(n^2): a message at MAX_CONTENT_CHARS (4,000 Chinese
-- characters) took ~140 ms to tokenise, 10,000 took ~1 s, and a turn tokenises its message while its recall
-- statement is planned. This definition splits the text into its characters once (string_to_array with a
-- NULL delimiter) and pairs each with the next (lead() over their positions): 4,000 characters in ~7 ms,
-- 10,000 in ~16 ms, on the bench machine.
--
-- The lexemes, their order and so their positions are the same as 0012's for every text (the pair of
-- characters i and i + 1 is kept when both are Han, Hiragana or Katakana, in the order of i), so the values
-- stored in companion_memories.lexemes stay valid and nothing is rewritten: replacing the body of an
-- IMMUTABLE function that a generated column uses is only sound when its results do not change, and
-- tests/test_lexical_recall.py checks that against 0012's definition on every language the tests write in
-- and on thousands of random mixes.
CREATE OR REPLACE FUNCTION engine.lexemes(body text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
RETURN to_tsvector('simple',
    regexp_replace(lower(body), '[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]', ' ', 'g') || ' ' ||
    coalesce((SELECT string_agg(c || n, ' ' ORDER BY i)
              FROM (SELECT c, i, lead(c) OVER (ORDER BY i) AS n
                    FROM unnest(string_to_array(body, NULL)) WITH ORDINALITY AS t(c, i)) AS pairs
              WHERE c ~ '[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]'
                AND n ~ '[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]'), ''));
