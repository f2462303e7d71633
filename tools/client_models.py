"""The Python client's models (clients/python/eros_client/models.py), generated from the chat function's OpenAPI
document (the one GET /v1/openapi.json serves) by datamodel-code-generator: pydantic models with the API's own
descriptions, literals for its vocabularies, its limits as constraints. A change to the API is a change to the
routes and models (functions/chat/), then ``.venv/bin/python tools/client_models.py`` writes the file again;
tests/test_python_client.py fails while the file differs from what this generates.

Why generated, and only the models: they are most of the client and must follow every field the API adds; the
methods are few, and what makes them worth using (the retry policy that honours ``retryable`` and Retry-After, ids
made once so that a retry is safe) is policy no generator writes (eros_client/_client.py is hand-written).

    .venv/bin/python tools/client_models.py          # write the models
    .venv/bin/python tools/client_models.py --check  # exit 1 when they are stale
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import api_doc  # noqa: E402  (tools/ is no package)

ROOT = api_doc.ROOT
TARGET = ROOT / "clients" / "python" / "eros_client" / "models.py"
REGENERATE = ".venv/bin/python tools/client_models.py"
HEADER = (f"# The API's request and response shapes, generated from its OpenAPI document by {REGENERATE}\n"
          "# (datamodel-code-generator): do not edit; change the API's models, then run it again.")
OPTIONS = ["--input-file-type", "openapi", "--output-model-type", "pydantic_v2.BaseModel",
           "--target-python-version", "3.10", "--use-standard-collections", "--use-union-operator",
           "--field-constraints", "--use-schema-description", "--use-field-description", "--use-annotated",
           "--enum-field-as-literal", "all", "--collapse-root-models", "--disable-timestamp",
           "--formatters", "ruff-format", "--custom-file-header", HEADER]


def generate() -> str:
    """The models' source, as the generator writes it for the current document."""
    with tempfile.TemporaryDirectory() as folder:
        document, output = Path(folder) / "openapi.json", Path(folder) / "models.py"
        document.write_text(json.dumps(api_doc.openapi_document()), encoding="utf-8")
        generator = Path(sys.executable).with_name("datamodel-codegen")
        subprocess.run([str(generator), "--input", str(document), "--output", str(output), *OPTIONS],
                       check=True, capture_output=True, text=True)
        return output.read_text(encoding="utf-8")


def main(argv: list[str]) -> int:
    text = generate()
    if "--check" in argv:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
