"""Extract (async invoke from the sweeper -> this Lambda): one claimed session into profile memories,
or, for an event of kind "deep_pass", one claimed user's deep pass (consolidation across sessions), or, for
"reembedding", one claimed user's re-embedding after a change of embedder."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter

from eros import tracing
from eros.config import settings
from eros.dreaming import deep_pass, reembedding, session
from eros.observability import logger, metrics, time_left


class ExtractEvent(BaseModel):
    """What the sweeper sends for one claimed session (``eros.dreaming.session.event``)."""
    model_config = ConfigDict(extra="ignore")

    kind: Literal["session"] = "session"  # session events carry no kind (what the sweeper has always sent)
    session_id: UUID
    user_id: str = Field(min_length=1)  # the session's user: a log key, so an operator can follow one user
    claim_token: AwareDatetime  # the claim's extraction_claimed_at; guards every write


class DeepPassEvent(BaseModel):
    """What the sweeper sends for one user claimed for a deep pass (``eros.dreaming.deep_pass.event``)."""
    model_config = ConfigDict(extra="ignore")

    kind: Literal["deep_pass"]
    user_id: str = Field(min_length=1)
    claim_token: AwareDatetime  # the user's user_deep_pass.claimed_at; guards every write


class ReembeddingEvent(BaseModel):
    """What the sweeper sends for one user claimed for a re-embedding (``eros.dreaming.reembedding.event``)."""
    model_config = ConfigDict(extra="ignore")

    kind: Literal["reembedding"]
    user_id: str = Field(min_length=1)
    claim_token: AwareDatetime  # the user's user_reembedding.claimed_at; guards every write


Job: TypeAdapter[ExtractEvent | DeepPassEvent | ReembeddingEvent] = TypeAdapter(
    Annotated[ExtractEvent | DeepPassEvent | ReembeddingEvent, Field(discriminator="kind")])


def job(event: object) -> ExtractEvent | DeepPassEvent | ReembeddingEvent:
    """The job an event asks for (a session's may leave ``kind`` out, as the sweeper has always sent it);
    a malformed event raises pydantic's ValidationError (``eros invoke`` checks an event file with it)."""
    return Job.validate_python({"kind": "session", **event} if isinstance(event, dict) else event)


@logger.inject_lambda_context(clear_state=True)  # no keys of the previous invocation
@tracing.lambda_handler(tracing.extract_annotations)  # no response or error in traces
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    # A malformed event raises: Lambda's retries then the OnFailure DLQ keep it for inspection.
    asked = job(event)
    logger.append_keys(user_id=asked.user_id)
    budget = time_left(context, reserve_secs=10)  # leave time to write and report
    if isinstance(asked, DeepPassEvent):
        return asdict(deep_pass.run(settings(), asked.user_id, asked.claim_token, time_budget_secs=budget))
    if isinstance(asked, ReembeddingEvent):
        return asdict(reembedding.run(settings(), asked.user_id, asked.claim_token, time_budget_secs=budget))
    logger.append_keys(session_id=str(asked.session_id))
    return asdict(session.extract_session(settings(), asked.user_id, asked.session_id, asked.claim_token,
                                          time_budget_secs=budget))
