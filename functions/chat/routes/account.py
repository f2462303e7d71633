"""The caller's account: a usage report, an export of everything held about them, and erasure."""

# No `from __future__ import annotations` here: pydantic and the resolver would then compile and evaluate
# every annotation of the models and routes from its text at import (~115 evaluations a cold start).
from datetime import date
from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query

from eros import account, usage
from eros.observability import logger, metrics

from models import Erased, Erasure, ExportLink, UsageReport
from routes import current_user, documented

router = Router()


@router.get("/v1/export", operation_id="exportAccount", tags=["account"],
            summary="everything the engine holds about the caller",
            description="Writes the caller's whole record as one JSON document and answers a link to it (a document "
                        "can be far larger than an API answer may be), a page of rows at a time. In AWS the file is "
                        "an object of the private, encrypted, TLS-only ExportBucket and the link is presigned for "
                        f"{account.URL_SECS // 60} minutes; in the local stack it is a file the stack serves under "
                        "/local/exports/. The file "
                        "is deleted within a day, and by DELETE /v1/me.",
            responses=documented((200, "the link"), (503, "exports_unavailable: exports are not configured here")))
def export_record() -> ExportLink:
    done = account.export(current_user(router))
    metrics.add_metric(name="ExportsWritten", unit="Count", value=1)
    return ExportLink(url=done.url, expires_at=done.expires_at, bytes=done.bytes)


@router.delete("/v1/me", operation_id="eraseAccount", tags=["account"], summary="erase everything of the caller",
               description="Messages, sessions, persona instances, both memory layers with their history, usage, and "
                           "any dreaming queued for them, in one transaction. Dreaming that is running writes nothing "
                           "after it (no memory, no usage). Idempotent: erasing again answers zeros. Operators: `eros "
                           "forget USER` does the same.",
               responses=documented((200, "what was erased")))
def erase_me() -> Erasure:
    erased = account.erase(current_user(router))
    logger.info("user erased", extra={"erased": erased})  # counts only: never the user id or any content
    metrics.add_metric(name="UsersErased", unit="Count", value=1)
    return Erasure(erased=Erased(**erased))


@router.get("/v1/usage", operation_id="getUsage", tags=["account"], summary="the caller's usage and its estimated cost",
            description="Tokens and provider calls per UTC day, purpose and model, with a cost estimated at the "
                        f"configured list prices. Without dates: the last {usage.DEFAULT_DAYS} days, today included "
                        f"(from 0001-01-01 at the earliest); at most {usage.MAX_DAYS} days at a time. A date that is "
                        f"not YYYY-MM-DD, a `from` after `to` or a longer range is a 422 naming the parameter.",
            responses=documented((200, "the report")))
def usage_report(first: Annotated[date | None, Query(alias="from", description="first UTC day (YYYY-MM-DD)")] = None,
                 last: Annotated[date | None, Query(alias="to", description="last UTC day, included")] = None
                 ) -> UsageReport:
    first, last = usage.days_of(first, last)
    return UsageReport.model_validate(usage.report(current_user(router), first, last))
