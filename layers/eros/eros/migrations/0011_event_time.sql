-- 0011 — event time (issue 14): when the thing a memory is about happened, beside when it was written.
--
-- A memory knew only its created_at, the moment dreaming wrote it. "I started at Siemens last week", said on
-- 2026-11-30, is about the week of 2026-11-16; "we met in 2019" about a year. Questions such as "when did I
-- start my new job?" need that date, and the time terms of recall should age a memory from the event, not
-- from the day it was mentioned.
--
-- occurred_at is the first day of the period the session named, occurred_precision its size: a day, an ISO
-- week (starting on its Monday), a month (its 1st) or a year (1 January). A date, not a timestamptz: people
-- speak of days, not instants, and a date has no time zone to get wrong. Both are null together (most
-- memories name no time), and the date is the start of its period, so two memories of "March 2019" carry
-- the same value whatever day extraction happened to pick.
ALTER TABLE engine.companion_memories
    ADD COLUMN occurred_at date,
    ADD COLUMN occurred_precision text,
    ADD CONSTRAINT companion_memories_occurred_check CHECK (
        (occurred_at IS NULL) = (occurred_precision IS NULL)
        AND CASE occurred_precision
                WHEN 'day' THEN true
                WHEN 'week' THEN extract(isodow FROM occurred_at) = 1
                WHEN 'month' THEN extract(day FROM occurred_at) = 1
                WHEN 'year' THEN extract(doy FROM occurred_at) = 1
                ELSE occurred_precision IS NULL
            END);
