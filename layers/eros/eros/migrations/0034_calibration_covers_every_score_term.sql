-- 0034 — a stored calibration covers every term recall adds to a cosine (issue 30).
--
-- Measured across embedders (bench/results/calibrate_embedders.md): besides the lexical and importance weights, the
-- demotion's penalty, recency's λ and the event-year weight move a score by a share of the gaps between a model's
-- cosines too; left at e5's values the read-time net did nothing on all-MiniLM-L6-v2. eros.calibration scales all
-- five. A row stored before this migration has none of the three: NULL, and eros.calibrated takes e5's value
-- scaled as that row's lexical weight was (the ratio it was calibrated with).
ALTER TABLE engine.embedding_calibrations
    ADD COLUMN IF NOT EXISTS demote_penalty      float8 CHECK (demote_penalty >= 0 AND demote_penalty <= 1),
    ADD COLUMN IF NOT EXISTS recency_weight      float8 CHECK (recency_weight >= 0 AND recency_weight <= 10),
    ADD COLUMN IF NOT EXISTS lexical_year_weight float8 CHECK (lexical_year_weight >= 0 AND lexical_year_weight <= 1);
