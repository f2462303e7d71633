"""Extract (async invoke from the sweeper -> this Lambda): one claimed session into profile memories."""

from __future__ import annotations

from dataclasses import asdict
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict

from eros import dreaming
from eros.config import settings
from eros.observability import logger, metrics, tracer


class ExtractEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    session_id: UUID
    user_id: str
    instance_id: UUID
    claim_token: AwareDatetime  # the claim's classification_claimed_at; guards every write


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    # A malformed event raises: Lambda's retries then the OnFailure DLQ keep it for inspection.
    job = ExtractEvent.model_validate(event)
    budget = max(1.0, context.get_remaining_time_in_millis() / 1000 - 10)  # leave time to write and report
    return asdict(dreaming.extract_session(settings(), job.session_id, job.claim_token, time_budget_secs=budget))
