-- 0012 — what recall's lexical part reads (issue 14): each memory's words, as full-text lexemes.
--
-- Embeddings blur exactly what a companion must get right: names ("Mehmet"), places, rare words, numbers.
-- Recall adds a small lexical score (BM25 over the user's own rows, eros/store/recall.py) to the cosine
-- similarity, so that an exact word breaks the tie. It needs the words of every memory, indexed the same way
-- as the message's: engine.lexemes() is that one definition, used by the column below and by the recall
-- statement for the message.
--
-- * Stock full-text search only (tsvector, the built-in 'simple' configuration): RDS and Aurora have it,
--   no extension needed. 'simple' lower-cases and keeps every word; it does not stem and knows no stop
--   words, which is what a multilingual store wants: the BM25 weight (inverse document frequency over the
--   user's rows) makes "my" and "the" worth nothing by itself, in any language.
-- * Chinese and Japanese have no spaces: the parser would see "养了一只猫" as one word, which no question
--   repeats. Runs of Han, Hiragana and Katakana become their overlapping character pairs ("养了 了一 一只
--   只猫"): most Chinese words are two characters, and a pair that spans two words is just a rare lexeme.
--   bench/results/recall_summary.md measures pairs against single characters and both. Korean separates
--   its words with spaces and is left to the parser, like every alphabetic language.
-- * The year of the memory's event time is one of its words: "what happened in 2019?" matches a memory
--   whose text only says "moved to Berlin" when its occurred_at is in 2019.
-- * A STORED generated column, not one the application fills: every path that writes a memory (dreaming,
--   the memory API, the deep pass, an evaluation's loader, a hand-written INSERT) gets it, and an edit of
--   the text recomputes it. It costs about 100 bytes a row.
-- * Adding it rewrites the table under an exclusive lock: 3.5 minutes for 1.2 million rows on the 2-core
--   bench machine (bench/results/turn_overhead.md's data set), during which turns and dreaming wait. A
--   deployment that large should apply it in a quiet hour; one that cannot wait would add a plain column
--   filled by a trigger and backfill it in batches instead (recall treats a missing row's lexemes as none).
-- * No index: recall scans one user's rows through the per-user indexes anyway (an exact scan, like the
--   vector part), and a global GIN index would find other users' rows first.
CREATE FUNCTION engine.lexemes(body text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
RETURN to_tsvector('simple',
    regexp_replace(lower(body), '[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]', ' ', 'g') || ' ' ||
    coalesce((SELECT string_agg(substr(body, i, 2), ' ')
              FROM generate_series(1, length(body) - 1) AS i
              WHERE substr(body, i, 2) ~ '^[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]{2}$'), ''));

ALTER TABLE engine.companion_memories
    ADD COLUMN lexemes tsvector NOT NULL GENERATED ALWAYS AS (
        engine.lexemes(content || coalesce(' ' || extract(year FROM occurred_at)::int, ''))) STORED;
