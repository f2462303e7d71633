"""docs/API.md, the HTTP API's reference, rendered from the chat function's OpenAPI document (the one
GET /v1/openapi.json serves): each route with its summary and description, parameters, request body fields,
answers, and the shapes they name. The words are the routes' and the models' (functions/chat/); a change to
the API is a change there, then ``.venv/bin/python tools/api_doc.py`` writes the file again.
tests/test_api_doc.py fails while the file differs from what this renders.

    .venv/bin/python tools/api_doc.py          # write docs/API.md
    .venv/bin/python tools/api_doc.py --check  # exit 1 when docs/API.md is stale
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "functions" / "chat"
TARGET = ROOT / "docs" / "API.md"
REGENERATE = ".venv/bin/python tools/api_doc.py"
METHODS = ("get", "post", "put", "patch", "delete")

Schema = dict[str, Any]


def openapi_document() -> Schema:
    """The document, from the chat function's code imported as Lambda imports it (its folder first on
    sys.path). Its modules are forgotten afterwards: a later import of the function gets its own routers."""
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location("eros_api_doc_chat", CHAT / "app.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"no chat function at {CHAT}")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(CHAT))
    try:
        spec.loader.exec_module(module)
        return json.loads(module.health.openapi_document())
    finally:
        sys.path.remove(str(CHAT))
        for name in set(sys.modules) - before:
            if CHAT in Path(getattr(sys.modules[name], "__file__", None) or "/").parents:
                del sys.modules[name]


def _cell(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _anchor(name: str) -> str:
    return name.lower()


def _ref_name(schema: Schema) -> str:
    return str(schema["$ref"]).rsplit("/", 1)[-1]


def _type(schema: Schema) -> str:
    """A schema's type in a few words: links for named shapes, the values of an enumeration."""
    if "$ref" in schema:
        name = _ref_name(schema)
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in schema:
        return " or ".join(_type(option) for option in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {_type(schema['additionalProperties'])}"
    if kind is None:
        return "any"
    return str(schema.get("format", kind))


def _number(value: Any) -> str:
    """A bound as the document has it: 500.0 is 500, but a float past 2**53 is not an exact integer."""
    exact = isinstance(value, float) and value.is_integer() and abs(value) < 2**53
    return str(int(value)) if exact else str(value)


_LIMITS = (("minLength", "at least {} character(s)"), ("maxLength", "at most {} characters"),
           ("minimum", "≥ {}"), ("ge", "≥ {}"), ("maximum", "≤ {}"), ("le", "≤ {}"),
           ("pattern", "matches `{}`"), ("default", "default {}"))


def _limits(schema: Schema) -> list[str]:
    """The constraints of a schema and of its options (an optional field's are on its non-null option)."""
    found = [text.format(_number(schema[key])) for key, text in _LIMITS if key in schema and schema[key] is not None]
    for option in schema.get("anyOf", ()):
        found += _limits(option)
    if schema.get("examples"):
        found.append("e.g. " + ", ".join(f"`{example}`" for example in schema["examples"]))
    return found


def _description(schema: Schema) -> str:
    """A field's description: its own, or its non-null option's."""
    own = schema.get("description")
    if own:
        return str(own)
    return next((str(option["description"]) for option in schema.get("anyOf", ()) if option.get("description")), "")


def _fields(schema: Schema) -> list[str]:
    """A table of an object's fields: name, type and constraints, description."""
    required = set(schema.get("required", ()))
    rows = ["| field | type | |", "| --- | --- | --- |"]
    for name, field in schema.get("properties", {}).items():
        kind = ", ".join([_type(field), *(["required"] if name in required else []), *_limits(field)])
        rows.append(f"| `{name}` | {_cell(kind)} | {_cell(_description(field))} |")
    if schema.get("additionalProperties") is False:
        rows.append("| *(any other field)* | refused (422) | |")
    return rows


def _parameters(operation: Schema) -> list[str]:
    if not operation.get("parameters"):
        return []
    rows = ["| parameter | in | type | |", "| --- | --- | --- | --- |"]
    for parameter in operation["parameters"]:
        schema = parameter.get("schema", {})
        kind = ", ".join([_type(schema), *(["required"] if parameter.get("required") else []), *_limits(schema)])
        rows.append(f"| `{parameter['name']}` | {parameter['in']} | {_cell(kind)} | "
                    f"{_cell(parameter.get('description') or _description(schema))} |")
    return [*rows, ""]


def _body(operation: Schema, components: Schema) -> list[str]:
    schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if schema is None:
        return []
    name = _ref_name(schema)
    return [f"Request body ([{name}](#{_anchor(name)}), JSON):", "", *_fields(components[name]), ""]


def _answer_body(response: Schema) -> str:
    schema = response.get("content", {}).get("application/json", {}).get("schema")
    if schema is None:
        return ""
    if "$ref" in schema:
        return _type(schema)
    return "[error](#errors)" if "statusCode" in schema.get("properties", {}) else _type(schema)


def _responses(operation: Schema) -> list[str]:
    rows = ["| status | when | body |", "| --- | --- | --- |"]
    for status, response in sorted(operation["responses"].items()):
        rows.append(f"| {status} | {_cell(response['description'])} | {_answer_body(response)} |")
    return [*rows, ""]


def _operation(method: str, path: str, operation: Schema, components: Schema) -> list[str]:
    public = operation.get("security") == [{}]
    heading = [f"### `{method.upper()} {path}`", "", f"**{operation.get('summary', '')}**"
               + (" (public: no token)" if public else "") + "."
               + (f" Operation `{operation['operationId']}`" if operation.get("operationId") else "")
               + (f", tag `{operation['tags'][0]}`." if operation.get("tags") else ""), ""]
    description = [operation["description"], ""] if operation.get("description") else []
    return [*heading, *description, *_parameters(operation), *_body(operation, components), *_responses(operation)]


def _schema(name: str, schema: Schema) -> list[str]:
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [" ".join(str(schema["description"]).split()), ""]
    if "enum" in schema:
        return [*lines, _type(schema) + ".", ""]
    return [*lines, *_fields(schema), ""]


def render(document: Schema) -> str:
    """docs/API.md's text for an OpenAPI document."""
    components = document.get("components", {}).get("schemas", {})
    bearer = document.get("components", {}).get("securitySchemes", {}).get("bearer", {})
    lines = [f"# {document['info']['title']}", "",
             f"<!-- Generated from the OpenAPI document by tools/api_doc.py; edit the routes and models in "
             f"functions/chat/, then run `{REGENERATE}`. -->", "",
             "The reference of every route, generated from the OpenAPI document the API serves "
             "(`GET /v1/openapi.json`; `GET /v1/docs` shows it as a Swagger page).", "",
             f"Every route but the public ones needs `Authorization: Bearer <JWT>`: {bearer.get('description', '')}.",
             "", document["info"].get("description", ""), "", "## Routes", ""]
    for path, operations in sorted(document["paths"].items()):
        for method in METHODS:
            if method in operations:
                lines += _operation(method, path, operations[method], components)
    lines += ["## Shapes", ""]
    for name, schema in components.items():
        lines += _schema(name, schema)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render(openapi_document())
    if argv == ["--check"]:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
