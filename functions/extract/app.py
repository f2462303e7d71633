"""Extract (async invoke from the sweeper -> this Lambda): one claimed session into profile memories,
or, for an event of kind "deep_pass", one claimed user's deep pass (consolidation across sessions)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from eros import deep_pass, dreaming
from eros.config import settings
from eros.observability import logger, metrics
from eros import tracing


class ExtractEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kind: Literal["session"] = "session"  # session events carry no kind (what the sweeper has always sent)
    session_id: UUID
    user_id: str
    instance_id: UUID
    claim_token: AwareDatetime  # the claim's extraction_claimed_at; guards every write


class DeepPassEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kind: Literal["deep_pass"]
    user_id: str = Field(min_length=1)
    claim_token: AwareDatetime  # the user's user_consolidation.claimed_at; guards every write


@logger.inject_lambda_context
@tracing.lambda_handler(tracing.extract_annotations)  # no response or error in traces
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    # A malformed event raises: Lambda's retries then the OnFailure DLQ keep it for inspection.
    budget = max(1.0, context.get_remaining_time_in_millis() / 1000 - 10)  # leave time to write and report
    if isinstance(event, dict) and event.get("kind") == deep_pass.KIND:
        job = DeepPassEvent.model_validate(event)
        return asdict(deep_pass.run(settings(), job.user_id, job.claim_token, time_budget_secs=budget))
    session = ExtractEvent.model_validate(event)
    return asdict(dreaming.extract_session(settings(), session.session_id, session.claim_token,
                                           time_budget_secs=budget))
