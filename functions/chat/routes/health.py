"""The service itself: is it up, are its parts working, and its OpenAPI document (also as a Swagger page)."""

# No `from __future__ import annotations` here: pydantic and the resolver would then compile and evaluate
# every annotation of the models and routes from its text at import (~115 evaluations a cold start).
import json

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver, Router

from eros import health as health_check

from models import DeepHealth, HealthReport
from routes import CONVENTIONS, INVALID_REQUEST, POWERTOOLS_422, PUBLIC, current_user, documented

router = Router()
TITLE = "eros companion memory API"


@router.get("/v1/health", operation_id="getHealth", tags=["health"], summary="is the service up", security=PUBLIC,
            responses=documented((200, "healthy"),
                                 (503, "degraded: the report (a HealthReport, not an error) says what"), public=True))
def health() -> Response[HealthReport]:
    report = health_check.report()
    return Response(200 if report["status"] == "ok" else 503, content_types.APPLICATION_JSON,
                    HealthReport.model_validate(report))


@router.get("/v1/health/deep", operation_id="getDeepHealth", tags=["health"],
            summary="check the database, the schema and each provider",
            description="Times a query, compares the applied migrations with the ones this build ships and makes one "
                        "tiny call to the chat model and the embedder, at most once per DEEP_HEALTH_CACHE_SECS (300) "
                        "per "
                        "container: meanwhile it answers the provider checks it made last, with their age, so "
                        "repeating it cannot make the deployment pay. Needs a token; the provider calls are the "
                        "deployment's, no user's usage (`eros doctor` runs the same checks, always calling the "
                        "providers). The `calibration` check and section say where the embedder's similarity "
                        "thresholds come from: a warning (not a failure) when its model has none, a failure when the "
                        "stored vectors came from another model than the configured embedder's.",
            responses=documented((200, "every check passed"),
                                 (503, "a check failed: the report (a DeepHealth, not an error) says which, and why")))
def deep_health() -> Response[DeepHealth]:
    current_user(router)
    report = health_check.deep_report()
    return Response(200 if report["status"] == "ok" else 503, content_types.APPLICATION_JSON,
                    DeepHealth.model_validate(report))


def openapi_document() -> str:
    """The API's OpenAPI document: every route's parameters, bodies and answers, and the bearer scheme
    every route but the public ones requires (the JWT the authorizer verifies). Powertools' OpenAPI models
    are imported here, on the first request for the document: they cost every cold start ~100 ms."""
    from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer

    resolver = router.api_resolver
    if not isinstance(resolver, ApiGatewayResolver):
        raise RuntimeError("the health routes are not included in a resolver")
    bearer = HTTPBearer(bearerFormat="JWT", description="a token of the configured issuer; its `sub` is the user")
    document = json.loads(resolver.get_openapi_json_schema(title=TITLE, version="1.0.0", description=CONVENTIONS,
                                                           security_schemes={"bearer": bearer},
                                                           security=[{"bearer": []}]))
    for operations in document["paths"].values():
        for operation in operations.values():
            operation["responses"]["422"] = INVALID_REQUEST
    for name in POWERTOOLS_422:
        document["components"]["schemas"].pop(name, None)
    return json.dumps(document)


@router.get("/v1/openapi.json", operation_id="getOpenApiDocument", tags=["health"],
            summary="this document", security=PUBLIC, compress=True)
def openapi():
    return Response(200, content_types.APPLICATION_JSON, openapi_document())


@router.get("/v1/docs", include_in_schema=False, compress=True)
def docs():
    """The Swagger UI over /v1/openapi.json's document, its script and styles inline (no request to a CDN).
    Built on the first visit: Powertools' ``enable_swagger`` imports its OpenAPI models at start-up, ~100 ms
    of every cold start for a page no chat turn needs."""
    from importlib.resources import files

    from aws_lambda_powertools.event_handler.openapi.swagger_ui import generate_swagger_html

    if router.current_event.get_query_string_value("format") == "json":  # the page's own link to its document
        return openapi()
    assets = files("aws_lambda_powertools.event_handler.openapi.swagger_ui")
    spec = openapi_document().replace("</", "<\\/")  # stays in its <script>
    page = generate_swagger_html(spec, assets.joinpath("swagger-ui-bundle.min.js").read_text("utf-8"),
                                 assets.joinpath("swagger-ui.min.css").read_text("utf-8"), "", None)
    return Response(200, content_types.TEXT_HTML, page)
