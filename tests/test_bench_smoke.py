"""Every bench runs at a tiny size and writes a report of the shape its results file has, so a change to the
package that breaks a bench fails here instead of on the next long run.

The benches run in-process through their ``main(argv)``, one after the other, in one database of their own
next to the tests' database on the session's embedded Postgres (``--database-url``); each report goes to a
temporary file, never into bench/results/. bench/consolidation_eval.py has its own, stronger test
(tests/test_consolidation_eval.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402
import calibrate_embedders  # noqa: E402
import claim_throughput  # noqa: E402
import cold_start  # noqa: E402
import event_time_eval  # noqa: E402
import extract_calls  # noqa: E402
import extraction_write  # noqa: E402
import import_history  # noqa: E402
import local_concurrency  # noqa: E402
import partitioned_recall  # noqa: E402
import recall_eval  # noqa: E402
import recall_latency  # noqa: E402
import recall_prefilter  # noqa: E402
import reembedding  # noqa: E402
import stream_latency  # noqa: E402
import turn_overhead  # noqa: E402

NUMBER = r"[0-9][0-9,]*(?:\.[0-9]+)?"
# What runs where: a new bench script must be added to one of these.
SMOKED_HERE = {"turn_overhead", "claim_throughput", "cold_start", "extract_calls", "local_concurrency",
               "recall_latency", "recall_eval", "event_time_eval", "partitioned_recall", "extraction_write",
               "recall_prefilter", "import_history", "reembedding", "calibrate_embedders", "stream_latency"}
SMOKED_ELSEWHERE = {"consolidation_eval": "tests/test_consolidation_eval.py",
                    "long_history_eval": "tests/test_long_history_eval.py",
                    "embed_recall_dev": "not a bench: a one-off tool that needs the models in throwaway virtualenvs"}


@pytest.fixture(scope="module")
def bench_url(database_url):
    """A database for the benches on the tests' Postgres, migrated once; and a check that no bench wrote
    into bench/results/."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    from eros.migrate import migrate

    results = {p: p.stat().st_mtime_ns for p in (BENCH / "results").iterdir()}
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS bench_smoke WITH (FORCE)")
        admin.execute("CREATE DATABASE bench_smoke")
    url = make_conninfo(database_url, dbname="bench_smoke")
    migrate(url)
    yield url
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE bench_smoke WITH (FORCE)")
    assert {p: p.stat().st_mtime_ns for p in (BENCH / "results").iterdir()} == results, "a bench wrote to bench/results"


def table_rows(report: str, header: str) -> list[list[str]]:
    """The cells of the rows of the markdown table whose header line starts with ``header``."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_every_bench_script_is_smoked():
    scripts = {p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert scripts == SMOKED_HERE | set(SMOKED_ELSEWHERE)


def test_turn_overhead(bench_url, tmp_path):
    out = tmp_path / "turn_overhead.md"
    assert turn_overhead.main(["--users", "3", "--memories-per-user", "4", "--relationship-per-user", "2",
                               "--history-per-user", "2", "--turns", "4", "--warmup", "1",
                               "--database-url", bench_url, "--output", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("# Chat-turn overhead: the memory part of a turn\n")
    assert re.search(rf"\*\*p95 = {NUMBER} ms at [0-9]+ database round trips per turn — goal ≤ 15 ms: "
                     r"(met|MISSED)\.\*\*", report)
    trips = {row[0]: row[1] for row in table_rows(report, "| turn | round trips |")}
    assert len(trips) == 4 and all(re.fullmatch("[0-9]+", n) for n in trips.values()), trips
    whole, cpu = table_rows(report, "| | p50 ms | p95 ms | p99 ms | mean ms | max ms |")
    assert whole[0] == "**whole turn (take_turn), wall clock**" and all(
        re.fullmatch(rf"\*\*{NUMBER}\*\*", c) for c in whole[1:])
    parts = {row[0]: row[1:] for row in table_rows(report, "| part of the turn |")}
    for stage in ("whole turn (this pass)", "open the turn (session, replay check, spend limits, the message, history)",
                  "recall (profile + relationship)", "persist (the reply, the session, the utterance)"):
        assert len(parts[stage]) == 5 and all(re.fullmatch(NUMBER, c) for c in parts[stage]), stage
    assert "4 timed after 1 warm-up turns" in report and "<details>" in report  # EXPLAIN ran
    assert report.endswith("\n\n" + _common.NOTES_MARKER + "\n")


def test_claim_throughput(bench_url, tmp_path):
    out = tmp_path / "claim_throughput.md"
    assert claim_throughput.main(["--sessions", "200", "--grid", "1x50,2x50", "--mode", "thread", "--repeat", "1",
                                  "--database-url", bench_url, "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("# Claim throughput\n") and "* **Command:** `.venv/bin/python bench/claim_throughput.py" \
        " --sessions 200 --grid 1x50,2x50" in report
    rows = table_rows(report, "| claimers | batch (LIMIT) |")
    assert [r[:2] for r in rows] == [["1 threads", "50"], ["2 threads", "50"]]
    for row in rows:
        assert re.fullmatch(NUMBER, row[2]) and row[5:7] == ["0", "0"]  # sessions/s; no duplicate, none missing


def test_extract_calls(bench_url, tmp_path):
    out = tmp_path / "extract_calls.md"
    assert extract_calls.main(["--sessions", "4", "--users", "2", "--turns", "1", "--workers", "2",
                               "--empty-every", "3", "--database-url", bench_url, "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("# Provider calls per extracted session\n")
    rows = {r[0]: r[1:] for r in table_rows(report, "| | sessions | LLM calls | embedding calls |")}
    assert rows["round 1: sessions with memories and an episode"][:3] == ["1", "1", "1"]
    assert rows["round 1: sessions with an episode alone (a row: it is embedded)"][:3] == ["2", "2", "2"]
    assert rows["round 1: sessions with nothing to remember and no episode"][:3] == ["1", "1", "0"]
    assert rows["**all sessions that wrote new rows**"][-1] == "exactly 2 (met)"
    assert "* **Result: PASS**" in report and _common.NOTES_MARKER not in report


def offline_only(url: str) -> None:
    """Empty the engine for a bench that embeds with the offline stand-in: the benches before it left the fake
    Voyage's vectors, and a database holds one model's vectors (issue 30: another model's turn is refused)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_common.EMPTY_ENGINE)


def test_cold_start(bench_url, tmp_path):
    """On a build put together from the working tree (the functions, the eros package as the layer; its
    dependencies from the virtualenv standing for the runtime's folder), not a `sam build`."""
    import shutil

    offline_only(bench_url)
    build = tmp_path / "build"
    for logical, function in cold_start.FUNCTIONS.items():
        shutil.copytree(ROOT / "functions" / function, build / logical, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "layers" / "eros" / "eros", build / "ErosLayer" / "python" / "eros",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "cold_start.md"
    figures = cold_start.main(["--reuse", "--build-dir", str(build), "--runs", "1", "--only", "chat",
                               "--runtime-packages", str(cold_start._site_packages()), "--database-url", bench_url,
                               "--out", str(out)])
    report = out.read_text()
    assert report.startswith("# Cold start: handler import, first request, deployment size\n")
    [row] = table_rows(report, "| function | import as shipped")
    assert row[0] == "chat" and all(re.fullmatch(r"\**" + NUMBER + r"\**", cell) for cell in row[1:])
    assert figures["first_request"]["total"] >= figures["first_request"]["invoke"] > 0
    assert figures["floor"] > 0 and re.search(r"\*\*Floor:\*\* .* takes \*\*" + NUMBER + r" ms\*\*", report)
    sizes = {r[0]: r[1:] for r in table_rows(report, "| artifact | unzipped MB | zipped MB |")}
    assert set(sizes) == {*cold_start.FUNCTIONS, "ErosLayer"} and float(sizes["ErosLayer"][0]) > 0
    assert not any(path.exists() for path in tmp_path.glob("eros-cold-*")), "the sandbox is left behind"


def test_local_concurrency(bench_url, tmp_path):
    offline_only(bench_url)
    out = tmp_path / "local_concurrency.md"
    assert local_concurrency.main(["--clients", "2", "--rounds", "2", "--runs", "1", "--containers", "2",
                                   "--database-url", bench_url, "--out", str(out)]) == 0
    [row] = table_rows(out.read_text(), "| run | clients | containers | requests |")
    assert row[:4] == ["1", "2", "2", "12"] and re.fullmatch(NUMBER, row[5]) and row[6:] == ["0", "0"]


def test_stream_latency(bench_url, tmp_path):
    """Streamed turns through the local stack's server, a fake model that streams (fast here), then the check that
    the deltas joined are the JSON route's reply."""
    offline_only(bench_url)
    out = tmp_path / "stream_latency.md"
    assert stream_latency.main(["--turns", "4", "--warmup", "1", "--turns-per-session", "2", "--first-token-ms", "5",
                                "--token-ms", "1", "--memories", "3", "--database-url", bench_url,
                                "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("# Streamed turns: time to the first word on the local stack\n")
    assert "* **Command:** `.venv/bin/python bench/stream_latency.py --turns 4 --warmup 1" in report
    assert re.search(rf"\*\*p95 = {NUMBER} ms from request to first delta — goal ≤ 100 ms: (met|MISSED)\.\*\*", report)
    rows = {r[0]: r[1:] for r in table_rows(report, "| | p50 ms | p95 ms | max ms |")}
    assert list(rows) == ["**request → first delta**", "engine: request → the model asked",
                          "model's first token (the fake's delay)", "model's first token → first delta at the client",
                          "request → done (the whole reply)"]
    assert all(re.fullmatch(rf"\**-?{NUMBER}\**", c) for r in rows.values() for c in r)
    assert rows["model's first token (the fake's delay)"] == ["5.0", "5.0", "5.0"]
    assert "**Streamed = JSON route, byte for byte: 5 of 5 utterances (PASS).**" in report
    checks = table_rows(report, "| utterance | delta events |")
    assert len(checks) == 5 and all(int(r[1]) > 1 and r[2] == r[3] and r[4] == "yes" for r in checks)
    assert "4 timed after 1 warm-up turns" in report and report.endswith("\n\n" + _common.NOTES_MARKER + "\n")


def test_turn_overhead_long_history(bench_url, tmp_path):
    out = tmp_path / "turn_overhead_long_history.md"
    assert turn_overhead.main(["--users", "3", "--memories-per-user", "4", "--relationship-per-user", "2",
                               "--history-per-user", "2", "--long-history", "60,120", "--long-profile", "30",
                               "--turns", "3", "--warmup", "1", "--unbounded-turns", "1",
                               "--database-url", bench_url, "--output", str(out)]) == 0
    rows = {r[0]: r[1:] for r in table_rows(out.read_text(), "| utterances | turns |")}
    assert list(rows) == ["60", "120", "60 unbounded", "120 unbounded"]
    assert [r[0] for r in rows.values()] == ["3", "3", "1", "1"]
    assert all(re.fullmatch(NUMBER, c) for r in rows.values() for c in r[1:5])
    parts = {r[0]: r[1:] for r in table_rows(out.read_text(), "| utterances (breakdown) | turns |")}
    assert list(parts) == ["60", "120"] and all(r[0] == "3" for r in parts.values())
    assert all(re.fullmatch(rf"{NUMBER} / {NUMBER}", c) for r in parts.values() for c in r[1:])


def test_turn_overhead_context(bench_url, tmp_path):
    out = tmp_path / "context_overhead.md"
    assert turn_overhead.main(["--users", "3", "--memories-per-user", "4", "--relationship-per-user", "2",
                               "--history-per-user", "2", "--context", "--turns", "3", "--warmup", "1",
                               "--database-url", bench_url, "--output", str(out)]) == 0
    rows = {r[0]: r[1:] for r in table_rows(out.read_text(), "| request | timed |")}
    assert len(rows) == 4 and all(r[0] == "3" for r in rows.values())
    assert all(re.fullmatch(NUMBER, c) for r in rows.values() for c in r[1:4])
    assert rows[next(iter(rows))][4:] == ["x1.00", "x1.00"]


def test_import_history(bench_url, tmp_path):
    out = tmp_path / "import_history.md"
    assert import_history.main(["--conversations", "12", "--users", "3", "--database-url", bench_url,
                                "--output", str(out)]) == 0
    report = out.read_text()
    rows = {r[0]: r[1:] for r in table_rows(report, "| run | wall s |")}
    assert [r[3:] for r in rows.values()] == [["12", rows["first import"][4]], ["12", "0"]]
    assert "in the order they went quiet: 3 of 3 users" in report


def test_recall_prefilter(bench_url, tmp_path):
    out = tmp_path / "recall_prefilter.md"
    assert recall_prefilter.main(["--queries", "3", "--pools", "50,100", "--recall-pools", "0,8", "--ks", "5",
                                  "--database-url", bench_url, "--out", str(out)]) == 0
    report = out.read_text()
    alone = table_rows(report, "| P (re-ranked exactly) | recall@5 |")
    assert [r[0] for r in alone] == ["50 (3% of the rows)", "100 (6% of the rows)"]
    assert all(0 <= float(r[1]) <= 1 for r in alone)
    through = table_rows(report, "| P | top 5: kept / identical |")
    assert [r[0] for r in through] == ["0", "8"] and all(re.fullmatch(rf"{NUMBER} / {NUMBER}", r[1])
                                                            for r in through)


def test_extraction_write(bench_url, tmp_path):
    import psycopg

    out = tmp_path / "extraction_write.md"
    res = extraction_write.main(["--users", "3", "--memories-per-user", "4", "--relationship-per-user", "2",
                                 "--history-per-user", "2", "--sessions", "2", "--turns", "1", "--memories", "2",
                                 "--database-url", bench_url, "--out", str(out)])
    assert res["outcomes"] == {"extracted": 2} and res["superseding"] == 2  # each showed a known memory to change
    report = out.read_text()
    assert report.startswith("# Extraction: the database side of one session's dreaming\n")
    rows = {r[0]: r[1:] for r in table_rows(report, "| per extraction | p50 ms |")}
    assert "**the write transaction** (finish: insert, supersede, confirm, stamp)" in rows and len(rows) == 6
    assert all(re.fullmatch(rf"\**{NUMBER}\**", c) for cells in rows.values() for c in cells)
    with psycopg.connect(bench_url) as conn:  # the data set is left as it was found
        left = conn.execute("SELECT count(*) FILTER (WHERE content LIKE 'Bench memory %'),"
                            " count(*) FILTER (WHERE superseded_at IS NOT NULL) FROM engine.companion_memories"
                            ).fetchone()
        turns = conn.execute("SELECT count(*) FROM engine.chat_messages WHERE client_turn_id LIKE 'bench-turn-%'"
                             ).fetchone()
    assert left == (0, 0) and turns == (0,)
    # Alternating with a user of a long history (turn_overhead.py --long-history's).
    res = extraction_write.main(["--users", "3", "--memories-per-user", "4", "--relationship-per-user", "2",
                                 "--history-per-user", "2", "--sessions", "2", "--turns", "1", "--memories", "2",
                                 "--long-history", "60", "--long-profile", "30",
                                 "--database-url", bench_url, "--out", str(out)])
    assert sum(res["outcomes"].values()) == 4  # extracted, or only consolidated (repeats)
    assert re.search(rf"Database part, long over small: p50 x{NUMBER}, p95 x{NUMBER}", out.read_text())


def test_recall_latency(bench_url, tmp_path):
    out = tmp_path / "recall_latency.md"
    assert recall_latency.main(["--users", "10", "--queries", "4", "--ivf-probes", "1", "--hnsw-ef", "40",
                                "--noise-vectors", "64", "--database-url", bench_url, "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("# Recall latency: 1,000 memory rows over 10 users\n")
    strategies = table_rows(report, "| strategy | p50 ms | p95 ms | max ms |")
    assert [r[0] for r in strategies] == [
        "grouped, each user's first read (rows not yet in the cache, or some of them)", "grouped", "recency",
        "composite"]
    assert all(re.fullmatch(NUMBER, c) for r in strategies for c in r[1:])
    queries = [r[0] for r in table_rows(report, "| query | rows indexed |")]
    assert queries == ["exact per-user (btree on user_id, all the user's rows)", "IVFFlat probes=1",
                       "HNSW ef_search=40"]
    # --exact-only (the size whose index builds would take hours): the same data, the exact query alone.
    # --large-user-rows: one more user with a very large memory, whose rows the others' count leaves out.
    assert recall_latency.main(["--users", "10", "--queries", "4", "--exact-only", "--noise-vectors", "64",
                                "--large-user-rows", "300", "--database-url", bench_url, "--out", str(out)]) == 0
    report = out.read_text()
    assert [r[0] for r in table_rows(report, "| query | rows indexed |")] == [
        "exact per-user (btree on user_id, all the user's rows)"]
    assert "No approximate index was built (`--exact-only`)." in report
    assert "## One user with a very large memory: 300 profile rows" in report
    large = table_rows(report, "| query | p50 ms | p95 ms | max ms |")
    assert [r[0] for r in large] == ["recall, grouped", "recall, recency", "recall, composite",
                                     "exact per-user top-K (profile layer)"]
    assert all(re.fullmatch(NUMBER, c) for r in large for c in r[1:])


def test_recall_eval(bench_url, tmp_path):
    out = tmp_path / "recall_eval.md"
    assert recall_eval.main(["--users", "zh01", "--database-url", bench_url, "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("# Recall evaluation: recall_dev, embeddings: ")
    assert "33 queries (0 English, 33 Chinese) over 70 memories of 1 users" in report
    assert "`.venv/bin/python bench/recall_eval.py --users zh01 --database-url" in report
    rows = table_rows(report, "| consolidation | strategy | parameters | hit@1 |")
    assert {r[0] for r in rows} == {"none", "oracle"}
    assert all(re.fullmatch(r"[0-9]+%", r[3]) and re.fullmatch(r"[01]\.[0-9]{3}", r[5]) for r in rows)  # hit@1, MRR


def test_calibrate_embedders(bench_url, tmp_path):
    """Every embedder's vectors load (the committed caches), calibrate() runs on each and both arms are measured."""
    out = tmp_path / "calibrate_embedders.md"
    assert calibrate_embedders.main(["--users", "en00,zh00", "--database-url", bench_url, "--out", str(out)]) == 0
    report = out.read_text()
    assert "`.venv/bin/python bench/calibrate_embedders.py --users en00,zh00 --database-url" in report
    rows = table_rows(report, "| embedder | arm | cur>old oracle |")
    arms = ("before", "after")
    assert [(r[0], r[1]) for r in rows] == [(n, arm) for n in calibrate_embedders.EMBEDDERS for arm in arms]
    assert all(re.fullmatch(r"[0-9.]+%", r[2]) and re.fullmatch(r"[0-9]+", r[6]) for r in rows)
    chosen = table_rows(report, "| embedder | model | neighbour pairs |")
    assert [r[0] for r in chosen] == list(calibrate_embedders.EMBEDDERS)
    assert all(0 < float(r[4]) < 1 for r in chosen)  # the demotion cut


def test_calibrate_embedders_experiments(bench_url, tmp_path):
    """--experiments: the other label-free calibrations, the deep-pass probes and the label-tuned grid are reported."""
    out = tmp_path / "calibrate_experiments.md"
    assert calibrate_embedders.main(["--experiments", "--users", "en00", "--embedders", "static", "--database-url",
                                     bench_url, "--out", str(out)]) == 0
    report = out.read_text()
    variants = table_rows(report, "| embedder | calibration | demote |")
    assert {r[1] for r in variants} >= {"calibrate()", "iqr spread", "no weight scaling"}
    assert [r[0] for r in table_rows(report, "| embedder | e5 0.85: cut")] == ["e5", "static"]
    grid = table_rows(report, "| embedder | setting | cur>old oracle |")
    assert {r[0] for r in grid} == {"e5", "static"} and all(re.fullmatch(r"[0-9.]+%", r[4]) for r in grid)


def test_event_time_eval(bench_url, tmp_path):
    """The scripted model through the real handlers: a week across "last week", a session crossing midnight, a
    day in Chinese (2018年5月12日) and a session with no time."""
    out = tmp_path / "event_time_eval.md"
    assert event_time_eval.main(["--cases", "en-01,en-14,zh-08,zh-09", "--database-url", bench_url,
                                 "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("# Event time evaluation: `--llm scripted`\n")
    assert "`.venv/bin/python bench/event_time_eval.py --cases en-01,en-14,zh-08,zh-09 --database-url" in report
    groups = {r[0]: r[1:] for r in table_rows(report, "| cases | sessions | right | exact match |")}
    assert groups["all"] == ["4", "4", "100.0 %", "100.0 %"] and groups["Chinese"][:2] == ["2", "2"]
    cases = {r[0]: r[3:] for r in table_rows(report, "| case | sent (UTC) |")}
    assert cases == {"en-01": ["2026-W47", "2026-W47", "✓"], "en-14": ["2026-11-25", "2026-11-25", "✓"],
                     "zh-08": ["2018-05-12", "2018-05-12", "✓"], "zh-09": ["—", "—", "✓"]}
    assert report.endswith("\n\n" + _common.NOTES_MARKER + "\n")


def test_partitioned_recall(bench_url, tmp_path):
    """Two databases beside the benches' own (one table, hash partitions by user), the same rows in both."""
    out = tmp_path / "partitioned_recall.md"
    assert partitioned_recall.main(["--users", "8", "--queries", "6", "--sessions", "40", "--batch", "10",
                                    "--rounds", "1", "--analysed", "2", "--noise-vectors", "64",
                                    "--database-url", bench_url, "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("# Recall and the claim: hash partitions by user against one table\n")
    assert "* **Command:** `.venv/bin/python bench/partitioned_recall.py --users 8 --queries 6" in report
    rows = {r[0]: r[1:] for r in table_rows(report, "| operation | one table p50 ms |")}
    assert list(rows) == ["recall (`candidates`, both layers)", "claim (batch 10)"]
    assert all(re.fullmatch(rf"\**{NUMBER}\**", c) for r in rows.values() for c in r)
    assert [r[-1] for r in rows.values()] == ["6", "4"]  # recalls, and claims of 10 per database
    assert "6 of 6 recalls returned the same rows in the same order" in report
    assert "a recall statement reads 1 of 4 partitions" in report and "duplicates 0 and 0" in report
    assert report.endswith("\n\n" + _common.NOTES_MARKER + "\n")


def test_results_writer_keeps_the_notes(tmp_path):
    """A re-run replaces the report and keeps what was written below the notes marker."""
    path = tmp_path / "r.md"
    _common.write_results(path, "# Report\n\n| a |\n")
    assert path.read_text() == "# Report\n\n| a |\n\n<!-- notes -->\n"
    path.write_text(path.read_text() + "## Notes\n\nhand-written\n")
    _common.write_results(path, "# Report 2\n")
    assert path.read_text() == "# Report 2\n\n<!-- notes -->\n## Notes\n\nhand-written\n"
    plain = tmp_path / "plain.md"
    _common.write_results(plain, "# Plain\n\n", notes=False)
    assert plain.read_text() == "# Plain\n\n"
    assert _common.write_results("-", "# nowhere\n") is None


def test_reembedding(bench_url, tmp_path):
    out = tmp_path / "reembedding.md"
    assert reembedding.main(["--memories", "300", "--users", "2", "--database-url", bench_url, "--out", str(out)]) == 0
    report = out.read_text()
    figures = {row[0]: row[1] for row in table_rows(report, "| figure | value |")}
    assert figures["sampled rows whose vector is not the new model's"].startswith("0 of ")
    assert re.fullmatch(r"\('voyage-3\.5-lite', None\)", figures["the recorded model after"])

