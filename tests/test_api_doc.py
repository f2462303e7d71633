"""docs/API.md is the OpenAPI document rendered (tools/api_doc.py): it cannot drift from the routes and models."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import api_doc  # noqa: E402  (tools/ is no package: the generator is a script)


def test_docs_api_md_is_what_the_generator_renders_now():
    expected = api_doc.render(api_doc.openapi_document())
    assert api_doc.TARGET.read_text(encoding="utf-8") == expected, \
        f"docs/API.md differs from the OpenAPI document: run {api_doc.REGENERATE}"


def test_every_route_of_the_document_has_its_section():
    document = api_doc.openapi_document()
    text = api_doc.render(document)
    for path, operations in document["paths"].items():
        for method in operations:
            assert f"### `{method.upper()} {path}`" in text
    assert "## Errors" in text and "`budget_exhausted`" in text


def test_the_rendering_names_types_limits_and_errors():
    document = {"info": {"title": "t", "description": "conventions"}, "paths": {"/v1/x": {"post": {
        "summary": "make an x", "security": [{}],
        "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewX"}}}},
        "responses": {"201": {"description": "made", "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/X"}}}},
            "409": {"description": "x_exists: taken", "content": {"application/json": {"schema": {
                "type": "object", "properties": {"statusCode": {"type": "integer"}}}}}}}}}},
        "components": {"schemas": {
            "NewX": {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 64, "description": "its | name"},
                "n": {"anyOf": [{"type": "integer", "maximum": 9.223372036854776e18}, {"type": "null"}],
                      "default": 10}}},
            "X": {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}}}}}}}
    text = api_doc.render(document)
    assert "### `POST /v1/x`\n\n**make an x** (public: no token)." in text
    assert "| `name` | string, required, at least 1 character(s), at most 64 characters | its \\| name |" in text
    assert "| `n` | integer or null, default 10, ≤ 9.223372036854776e+18 |" in text
    assert "| *(any other field)* | refused (422) | |" in text
    assert "| 201 | made | [X](#x) |" in text and "| 409 | x_exists: taken | [error](#errors) |" in text
    assert "| `tags` | list of one of `a`, `b` |" in text
