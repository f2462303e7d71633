"""Thresholds per embedding model, wired into the engine (issue 30): the deployment records which model embedded
its vectors and refuses another (migration 0032, eros.calibrated.guard), the knobs come from the environment >
`eros calibrate`'s stored calibration > the shipped one > e5's defaults, `eros calibrate` derives them from the
deployment's memories, and `/v1/health/deep` / `eros doctor` say where they come from."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import psycopg
import pytest
from helpers import migrate_before
from pgvector import Vector
from psycopg.types.json import Jsonb
from test_migrations import fresh_database  # noqa: F401 -- the fixture

from eros import calibrated, calibration, chat, recall
from eros.calibration import REFERENCE, Calibration
from eros.config import EMBED_DIM, Settings
from eros.providers import EmbedderMismatch
from eros.providers.offline import HashingEmbedder
from eros.store import chat as chat_store
from eros_dev import cli

OFFLINE = HashingEmbedder.model  # the configured embedder's model in these tests (no key, no base URL)
KNOB_VALUES = {"dedupe_similarity": 0.9, "demote_similarity": 0.8, "deep_pass_similarity": 0.7,
               "lexical_weight": 0.03, "importance_weight": 0.08}


def unit(v: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


def axis(i: int) -> list[float]:
    return [1.0 if d == i else 0.0 for d in range(EMBED_DIM)]


def store(db, user: str, content: str, vector: list[float], category: str = "fact", model: str | None = OFFLINE):
    return db.execute(
        "INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance, metadata)"
        " VALUES (%s, %s, %s, %s, 0.5, %s) RETURNING id",
        (user, content, Vector(vector), category, Jsonb({"embed_model": model} if model else {}))).fetchone()["id"]


def seed(db, model: str, noise: float, *, users: int = 3, per_category: int = 30, seed_: int = 1) -> int:
    """Memories of a fake model whose cosines are compressed (small ``noise``: every pair near 1) or spread
    (large): each user's category is a cloud of unit vectors around its own direction."""
    rng = random.Random(seed_)
    rows = []
    for u in range(users):
        for category in ("fact", "preference"):
            centre = unit([rng.gauss(0, 1) for _ in range(EMBED_DIM)])
            for i in range(per_category):
                scale = noise * rng.uniform(0.5, 1.5) / math.sqrt(EMBED_DIM)
                v = unit([c + rng.gauss(0, scale) for c in centre])
                rows.append((f"user{u}", f"{category} {i} of user {u}", Vector(v), category,
                             Jsonb({"embed_model": model})))
    with db.cursor() as cur:
        cur.executemany("INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance,"
                        " metadata) VALUES (%s, %s, %s, %s, 0.5, %s)", rows)
    return len(rows)


def stored_calibrations(db) -> list[dict]:
    return db.execute("SELECT * FROM engine.embedding_calibrations ORDER BY id").fetchall()


def save(db, model: str = OFFLINE, **values: float) -> None:
    v = KNOB_VALUES | values
    db.execute("INSERT INTO engine.embedding_calibrations (model, dimension, dedupe_similarity, demote_similarity,"
               " deep_pass_similarity, lexical_weight, importance_weight, source, sample)"
               " VALUES (%s, 512, %s, %s, %s, %s, %s, 'calibrated', 120)",
               (model, v["dedupe_similarity"], v["demote_similarity"], v["deep_pass_similarity"],
                v["lexical_weight"], v["importance_weight"]))
    calibrated.reset()


# --- the embedding space: recorded, and another model refused --------------------------------------------------

def test_the_first_vector_written_records_its_model_and_dimension(db):
    assert calibrated.space() is None
    session = chat_store.create_session("alice", "luna")
    chat.take_turn("alice", session["id"], "I moved to Tokyo last spring", "t1")  # its utterance is a vector
    row = db.execute("SELECT model, dimension FROM engine.embedding_space").fetchone()
    assert row == {"model": OFFLINE, "dimension": EMBED_DIM}


def test_a_turn_with_another_embedder_than_the_stored_vectors_is_refused_before_anything_is_compared(db):
    """Before issue 30 the query vector of the configured model was compared with stored vectors of another."""
    store(db, "alice", "Lives in Tokyo", axis(0), model="voyage-3.5-lite")
    session = chat_store.create_session("alice", "luna")
    with pytest.raises(chat.TurnFailed) as failed:
        chat.take_turn("alice", session["id"], "Where do I live?", "t1")
    assert failed.value.code == "provider_misconfigured" and failed.value.status == 503
    assert "not the model the stored memories were embedded with" in str(failed.value)
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"] == 1  # no utterance
    with pytest.raises(EmbedderMismatch, match="embedded by 'voyage-3.5-lite', but the configured embedder is"):
        calibrated.guard(OFFLINE)
    with pytest.raises(EmbedderMismatch):
        recall.recall("alice", None, axis(0), model=OFFLINE)
    calibrated.guard("voyage-3.5-lite")  # the stored vectors' own model passes


def test_the_database_refuses_a_vector_of_another_model_on_any_write_path(db):
    store(db, "alice", "Lives in Tokyo", axis(0))
    with pytest.raises(psycopg.Error) as refused:
        store(db, "alice", "Works as a nurse", axis(1), model="text-embedding-3-small")
    assert refused.value.sqlstate == "EM001" and "embedded by offline/lexical-hash-512" in str(refused.value)
    store(db, "alice", "Hand-seeded, no model named", axis(2), model=None)  # not checked
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"] == 2


# --- precedence: environment > stored calibration > shipped > defaults -----------------------------------------

def test_an_uncalibrated_model_gets_the_defaults_and_says_so(db):
    used = calibrated.effective()
    assert (used.model, used.source, used.calibrated) == (OFFLINE, "default", False)
    assert used.values == {k: getattr(REFERENCE, k) for k in calibrated.KNOBS}
    assert used.recall == Settings().recall  # the same knobs as before issue 30


def test_a_shipped_calibration_is_used_for_its_model(db, monkeypatch):
    shipped = Calibration(OFFLINE, source="shipped", **KNOB_VALUES)
    monkeypatch.setitem(calibration.SHIPPED, OFFLINE, shipped)
    used = calibrated.effective()
    assert used.source == "shipped" and used.values == KNOB_VALUES | {
        k: getattr(REFERENCE, k) for k in calibrated.SCALED} and used.deep_pass_similarity == 0.7
    assert (used.recall.dedupe_similarity, used.recall.lexical_weight) == (0.9, 0.03)


def test_a_stored_calibration_wins_over_the_shipped_one_and_the_environment_over_both(db, env, monkeypatch):
    monkeypatch.setitem(calibration.SHIPPED, OFFLINE, Calibration(OFFLINE, source="shipped", **(
        KNOB_VALUES | {"lexical_weight": 0.5})))
    save(db, lexical_weight=0.04)
    used = calibrated.effective()
    assert used.source == "calibrated" and used.values["lexical_weight"] == 0.04 and used.sample == 120

    env(RECALL_LEXICAL_WEIGHT="0.2", DEEP_PASS_SIMILARITY="0.6")
    used = calibrated.effective()
    assert used.values["lexical_weight"] == 0.2 and used.sources["lexical_weight"] == "env"
    assert used.deep_pass_similarity == 0.6 and used.sources["deep_pass_similarity"] == "env"
    assert used.values["dedupe_similarity"] == 0.9 and used.sources["dedupe_similarity"] == "calibrated"
    assert used.source == "calibrated"  # not every knob is the environment's

    env(RECALL_DEDUPE_SIMILARITY="0.99", RECALL_DEMOTE_SIMILARITY="0.85", RECALL_IMPORTANCE_WEIGHT="0.05",
        RECALL_DEMOTE_PENALTY="0.01", RECALL_DECAY_LAMBDA="0.002", RECALL_LEXICAL_YEAR_WEIGHT="0.05")
    assert calibrated.effective().source == "env"


def test_a_row_stored_before_migration_0034_gets_the_other_weights_scaled_as_its_lexical_one(db):
    """save() writes no demote_penalty, recency_weight or lexical_year_weight, as a row stored before 0034 has none:
    they are e5's scaled by the row's lexical ratio (0.03 / 0.01), and recall uses them."""
    save(db)
    used = calibrated.effective()
    assert used.source == "calibrated"
    assert {k: round(used.values[k], 6) for k in calibrated.SCALED} == {
        "demote_penalty": 0.03, "recency_weight": 0.006, "lexical_year_weight": 0.15}
    assert (used.recall.demote_penalty, round(used.recall.lam, 6)) == (pytest.approx(0.03), 0.006)


def test_recall_drops_near_duplicates_at_the_calibrated_cut(db, env):
    """The calibration reaches recall: two memories 0.9 apart are both recalled under e5's 0.97, one of them under
    a calibrated 0.85, and both again when the environment sets the cut."""
    store(db, "alice", "Lives in Tokyo", axis(0), "fact")
    store(db, "alice", "Likes Tokyo's cafes", [0.9 if d == 0 else math.sqrt(1 - 0.81) if d == 1 else 0.0
                                               for d in range(EMBED_DIM)], "preference")
    assert len(recall.recall("alice", None, axis(0)).profile) == 2
    save(db, dedupe_similarity=0.85)
    assert len(recall.recall("alice", None, axis(0)).profile) == 1
    env(RECALL_DEDUPE_SIMILARITY="0.97")
    assert len(recall.recall("alice", None, axis(0)).profile) == 2


def test_the_deep_pass_clusters_at_the_calibrated_cut(db, monkeypatch):
    from eros.dreaming import deep_pass

    save(db, deep_pass_similarity=0.66)
    asked = []

    def snapshot(user_id, max_rows, similarity):
        asked.append(similarity)
        raise LookupError("enough")

    monkeypatch.setattr(deep_pass.deep_pass_store, "snapshot", snapshot)
    with pytest.raises(LookupError):
        deep_pass._run(Settings(), SimpleNamespace(row={"user_id": "alice", "lease": None}), 10.0)
    with pytest.raises(LookupError):
        deep_pass._run(Settings(deep_pass_similarity=0.8), SimpleNamespace(row={"user_id": "alice", "lease": None}), 1)
    assert asked == [0.66, 0.8]


@pytest.mark.parametrize("values, why", [
    ({"deep_pass_similarity": 0.95, "dedupe_similarity": 0.9}, "above dedupe_similarity"),
    ({"demote_similarity": 0.5}, "not between deep_pass_similarity"),
])
def test_a_stored_calibration_that_makes_no_sense_is_not_used_and_health_says_so(db, values, why):
    save(db, **values)
    used = calibrated.effective()
    assert used.source == "default" and used.refused and why in used.refused
    check = calibrated_check()
    assert check["status"] == "warning" and "is not used" in check["detail"] and why in check["detail"]


@pytest.mark.parametrize("column, value", [("dedupe_similarity", 1.5), ("lexical_weight", -0.1),
                                           ("deep_pass_similarity", 0.0), ("sample", -1)])
def test_the_database_refuses_a_calibration_out_of_range(db, column, value):
    with pytest.raises(psycopg.errors.CheckViolation):
        save(db, **{column: value}) if column != "sample" else db.execute(
            "INSERT INTO engine.embedding_calibrations (model, dimension, dedupe_similarity, demote_similarity,"
            " deep_pass_similarity, lexical_weight, importance_weight, source, sample)"
            " VALUES ('m', 512, 0.9, 0.8, 0.7, 0.01, 0.05, 'calibrated', %s)", (value,))


# --- eros calibrate ------------------------------------------------------------------------------------------

def calibrate_json(capsys, *extra: str) -> dict:
    assert cli.main(["calibrate", "--json", *extra]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_calibrate_follows_the_model_s_scale_stores_it_and_reports_it(db, capsys):
    seed(db, OFFLINE, noise=0.25)  # compressed: neighbours near 0.97
    dry = calibrate_json(capsys, "--dry-run")
    assert dry["stored"] is False and not stored_calibrations(db)
    compressed = calibrate_json(capsys)
    assert compressed["model"] == OFFLINE and compressed["stored"] is True and compressed["pairs"] == 180
    knobs = {k["knob"]: k for k in compressed["knobs"]}
    assert knobs["dedupe_similarity"]["before_source"] == "default" and knobs["dedupe_similarity"]["default"] == 0.97
    assert knobs == {k["knob"]: k for k in dry["knobs"]}  # the dry run showed what was then stored
    [row] = stored_calibrations(db)
    assert row["model"] == OFFLINE and row["sample"] == 180 and row["source"] == "calibrated"
    assert row["demote_similarity"] == knobs["demote_similarity"]["chosen"]
    assert calibrated.effective().source == "calibrated"  # used from now on

    db.execute("DELETE FROM engine.companion_memories")
    seed(db, OFFLINE, noise=2.0, seed_=2)  # spread: neighbours far lower
    spread = {k["knob"]: k for k in calibrate_json(capsys)["knobs"]}
    assert spread["dedupe_similarity"]["before_source"] == "calibrated"  # the previous run's
    for name in ("dedupe_similarity", "demote_similarity", "deep_pass_similarity"):
        assert spread[name]["chosen"] < knobs[name]["chosen"], name
    assert spread["lexical_weight"]["chosen"] > knobs["lexical_weight"]["chosen"]
    assert len(stored_calibrations(db)) == 2 and calibrated.effective().values["demote_similarity"] == (
        spread["demote_similarity"]["chosen"])


def test_calibrate_says_what_it_chose_beside_the_defaults(db, env, capsys):
    seed(db, OFFLINE, noise=1.0)
    env(RECALL_LEXICAL_WEIGHT="0.02")
    assert cli.main(["calibrate"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{OFFLINE}: thresholds from 180 memories") and out[0].endswith("stored")
    assert out[1].split() == ["setting", "default", "used", "until", "now", "chosen"]
    assert [line.split()[0] for line in out[2:2 + len(calibrated.KNOBS)]] == [calibrated.ENV_NAMES[k]
                                                                            for k in calibrated.KNOBS]
    assert out[4].split()[1:3] == ["0.01", "0.02"] and "(env)" in out[4]
    assert out[-1] == "note: set in the environment, so still used instead of the chosen value: RECALL_LEXICAL_WEIGHT"


def test_calibrate_refuses_too_few_memories_and_stores_nothing(db, capsys):
    seed(db, OFFLINE, noise=1.0, users=1, per_category=10)  # 20 memories, each with neighbours: too few
    assert cli.main(["calibrate"]) == 1
    err = capsys.readouterr().err
    assert "needs at least 50 active profile memories" in err and "this deployment has 20" in err
    assert "nothing was stored" in err and not stored_calibrations(db)


def test_calibrate_refuses_thresholds_that_make_no_sense(db, capsys, monkeypatch):
    seed(db, OFFLINE, noise=1.0)
    monkeypatch.setattr(calibration, "calibrate", lambda model, cosines: Calibration(
        model, source="calibrated", sample=len(cosines), **(KNOB_VALUES | {"deep_pass_similarity": 0.99})))
    assert cli.main(["calibrate"]) == 1
    err = capsys.readouterr().err
    assert "not usable" in err and "above dedupe_similarity" in err and not stored_calibrations(db)


@pytest.mark.parametrize("argv, said", [
    (["calibrate", "--user", "alice"], "unrecognized arguments: --user alice"),
    (["calibrate", "--sample", "10"], "argument --sample: 10 is not between 50 and 20000"),
    (["calibrate", "--sample", "many"], "argument --sample: not a whole number: 'many'")])
def test_calibrate_refuses_bad_arguments(argv, said, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2 and said in capsys.readouterr().err


# --- health and doctor ---------------------------------------------------------------------------------------

def calibrated_check() -> dict:
    from eros.health import deep_report

    return deep_report(fresh=True)["checks"]["calibration"]


def test_health_warns_about_an_uncalibrated_embedder_without_failing(db, monkeypatch):
    from eros.health import deep_report

    report = deep_report(fresh=True)
    check = report["checks"]["calibration"]  # the offline stand-in: e5's defaults on purpose, no warning
    assert check["status"] == "ok" and "the offline stand-in" in check["detail"], check
    monkeypatch.setattr(calibrated, "configured_model", lambda: "text-embedding-3-small")
    report = deep_report(fresh=True)
    check = report["checks"]["calibration"]
    assert report["status"] == "ok" and check["status"] == "warning"
    assert "'text-embedding-3-small' has NO calibration" in check["detail"] and "eros calibrate" in check["detail"]
    assert "(no vector stored yet)" in check["detail"]
    assert report["calibration"]["source"] == "default" and report["calibration"]["mismatch"] is False


def test_health_names_a_stored_or_shipped_calibration(db, env, monkeypatch):
    monkeypatch.setitem(calibration.SHIPPED, OFFLINE, Calibration(OFFLINE, source="shipped", **KNOB_VALUES))
    check = calibrated_check()
    assert check["status"] == "ok" and "the calibration this build ships" in check["detail"]
    save(db)
    env(RECALL_LEXICAL_WEIGHT="0.02")
    check = calibrated_check()
    assert check["status"] == "ok" and "calibrated by `eros calibrate`" in check["detail"]
    assert "from 120 memories" in check["detail"] and "from the environment: RECALL_LEXICAL_WEIGHT" in check["detail"]


def test_health_and_doctor_fail_when_the_stored_vectors_are_another_model_s(db, capsys):
    store(db, "alice", "Lives in Tokyo", axis(0), model="voyage-3.5-lite")
    from eros.health import deep_report

    report = deep_report(fresh=True)
    check = report["checks"]["calibration"]
    assert report["status"] == "failed" and check["status"] == "failed"
    assert "embedded by 'voyage-3.5-lite' (512-d)" in check["detail"] and f"is '{OFFLINE}'" in check["detail"]
    assert report["calibration"] | {"mismatch": True, "stored_model": "voyage-3.5-lite",
                                    "configured_model": OFFLINE} == report["calibration"]

    assert cli.main(["doctor"]) == 1
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.split()[:2] == ["BAD", "calibration"] and "turns and dreaming are refused" in line


def test_once_no_vector_of_the_recorded_model_is_left_the_next_model_is_recorded(db):
    """A deployment whose memories were all erased (or a dev database whose rows a test deleted) has nothing to mix
    with: the next model written is recorded instead of refused."""
    old = store(db, "alice", "Lives in Tokyo", axis(0), model="voyage-3.5-lite")
    with pytest.raises(EmbedderMismatch):
        calibrated.guard(OFFLINE)
    db.execute("DELETE FROM engine.companion_memories WHERE id = %s", (old,))
    calibrated.reset()
    calibrated.guard(OFFLINE)  # the space still names voyage, but none of its vectors is left
    store(db, "alice", "Lives in Kyoto", axis(1))
    assert db.execute("SELECT model FROM engine.embedding_space").fetchone()["model"] == OFFLINE


def test_an_existing_deployment_records_the_model_of_its_newest_vector(fresh_database):  # noqa: F811
    from eros.migrate import migrate

    with psycopg.connect(fresh_database, autocommit=True) as conn:
        migrate_before(conn, "0032")
        for model, day in (("voyage-3", "2025-01-01"), ("voyage-3.5-lite", "2025-06-01")):
            conn.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, source,"
                         " metadata, created_at) VALUES ('old', %s, %s::vector, 'fact', 'dreaming',"
                         " jsonb_build_object('embed_model', %s::text), %s::timestamptz)",
                         (f"from {model}", str(axis(0)), model, day))
    migrate(fresh_database)
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT model, dimension FROM engine.embedding_space").fetchone() == (
            "voyage-3.5-lite", EMBED_DIM)
