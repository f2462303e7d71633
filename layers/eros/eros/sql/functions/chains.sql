-- Version chains: the database keeps them (current definitions; README.md here says how this file is applied and
-- what a changed signature must do). Created by migration 0017, which says what a version chain is (the profile
-- rows that are versions of one fact, named by chain_id; NULL is a chain of its own, named by the row's id) and
-- why the database enforces that a chain has at most one active row (companion_memories_one_current_version).

-- A profile row that gets a successor joins the successor's version chain, and so do the rows of the two
-- chains: the successor's chain takes the retired row's name (an edit's successor is a new row: one row moves).
-- AFTER the row is written, so the retired row is no longer active when the chains become one; a
-- relationship-layer row ('outdated': its successor is the fact it stated) never joins anything.
CREATE OR REPLACE FUNCTION engine.join_version_chains() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    retired uuid;  -- the retired row's chain as it is now (an earlier row of the same statement may have moved it)
    joining uuid;  -- the successor's
BEGIN
    SELECT coalesce(m.chain_id, m.id) INTO retired FROM engine.companion_memories m
    WHERE m.id = NEW.id AND m.user_id = NEW.user_id;
    SELECT coalesce(s.chain_id, s.id) INTO joining FROM engine.companion_memories s
    WHERE s.id = NEW.superseded_by AND s.user_id = NEW.user_id AND s.instance_id IS NULL;
    IF retired IS NOT NULL AND joining IS NOT NULL AND retired <> joining THEN
        UPDATE engine.companion_memories m SET chain_id = retired
        WHERE m.user_id = NEW.user_id AND m.instance_id IS NULL
          AND (m.chain_id = joining OR (m.id = joining AND m.chain_id IS NULL));
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER companion_memories_join_version_chains
    AFTER UPDATE OF superseded_by ON engine.companion_memories
    FOR EACH ROW
    WHEN (NEW.superseded_by IS NOT NULL AND NEW.superseded_by IS DISTINCT FROM OLD.superseded_by
          AND NEW.instance_id IS NULL)
    EXECUTE FUNCTION engine.join_version_chains();
-- The engine never inserts a row that is already superseded, but an import or a repair script may: the same
-- rule. A row inserted without a successor (every turn's utterance) calls nothing.
CREATE OR REPLACE TRIGGER companion_memories_join_version_chains_on_insert
    AFTER INSERT ON engine.companion_memories
    FOR EACH ROW
    WHEN (NEW.superseded_by IS NOT NULL AND NEW.instance_id IS NULL)
    EXECUTE FUNCTION engine.join_version_chains();
