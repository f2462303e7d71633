-- 0022 — the deep pass's table says "deep pass", and 0018's turn functions retire (issue 26).
--
-- One word per concept: the per-user pass is the deep pass everywhere (eros.dreaming.deep_pass, the job kind,
-- the extract event's kind "deep_pass", a memory's source and a provider call's purpose 'deep_pass', the docs),
-- but its job table was engine.user_consolidation. It is engine.user_deep_pass now: one row per user, named like
-- the other per-user tables (user_usage, user_model_usage) and after its job kind. The columns stay: its lifecycle
-- columns are the claims' (store/claims.py), unprefixed, and consolidated_at is when the pass last consolidated.
--
-- During a deploy, Lambda containers of the previous release keep running and still name engine.user_consolidation
-- (their claim, start, lease, retry, give-up, erasure and spend statements). So the old name stays as a view over
-- the table: a view over one table's columns alone is automatically updatable, so their SELECT .. FOR UPDATE,
-- INSERT .. ON CONFLICT, UPDATE and DELETE reach the table's rows, under its constraints and indexes. eros_app
-- gets on it what it has on the table (engine.grant_app_role(), which eros.migrate calls after every run, grants
-- every table and view of the schema). A later migration drops the view, once no deployed code names it.
ALTER TABLE engine.user_consolidation RENAME TO user_deep_pass;
ALTER INDEX engine.user_consolidation_pkey RENAME TO user_deep_pass_pkey;
ALTER INDEX engine.user_consolidation_due_idx RENAME TO user_deep_pass_due_idx;
ALTER INDEX engine.user_consolidation_claimed_idx RENAME TO user_deep_pass_claimed_idx;

CREATE VIEW engine.user_consolidation AS SELECT * FROM engine.user_deep_pass;
COMMENT ON VIEW engine.user_consolidation IS
    'The previous release''s name of engine.user_deep_pass (migration 0022), for its containers during a deploy;'
    ' a later migration drops it.';

-- The previous release calls engine.open_turn_v2 and engine.admit_v2 (eros/sql/functions/turn.sql and spend.sql),
-- so the signatures 0018 created for the release before it have no caller left (the _v2 rule,
-- eros/sql/functions/README.md).
DROP FUNCTION IF EXISTS engine.open_turn(text, uuid, text, text, int, boolean, date, timestamptz, int, bigint,
                                         timestamptz, bigint, timestamptz);
DROP FUNCTION IF EXISTS engine.admit(text, date, timestamptz, timestamptz, int, bigint, bigint, timestamptz, int);
