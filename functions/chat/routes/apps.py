"""The app's operator's routes (migration 0036, eros.apps): the app itself, its API keys, its users' usage, its webhook
(migration 0037, eros.webhooks). Each
acts on the caller's app alone (``current_operator``): another app's key ids answer 404, as unknown ones do."""

# No `from __future__ import annotations` here (routes/sessions.py says why).
from datetime import date
from typing import Annotated
from uuid import UUID

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query

from eros import apps, errors, usage, webhooks
from eros.config import settings
from eros.store import apps as app_store

from models import ApiKeyList, AppUsageReport, AppView, IssuedKey, NewKey, NewWebhook, Redriven, Webhook, WebhookSet
from routes import OPERATORS, current_operator, documented

router = Router()
_NOT_LIVE = (404, "no live key of the app by that id (another app's key answers the same)")


def _not_live(key_id: UUID) -> errors.NotFound:
    return errors.NotFound(f"no live API key {key_id} in this app")


@router.get("/v1/operator/app", operation_id="getApp", tags=["operator"], summary="the caller's app and its settings",
            responses=documented((200, "the app"), OPERATORS))
def get_app() -> AppView:
    caller_app = current_operator(router)
    found = app_store.find(caller_app)
    if found is None:  # deleted since the caller was identified
        raise errors.NotFound(f"no app {caller_app!r}")
    return AppView.model_validate(found)


@router.post("/v1/operator/keys", operation_id="createKey", tags=["operator"], summary="make an API key of the app",
             description="For the app's servers: the `/server` routes take it in the X-Api-Key header (and the user "
                         "they act for in X-Eros-User). The answer's `secret` is the key, shown this once: only its "
                         "SHA-256 is kept, so a lost key is rotated or revoked, never shown again.",
             responses=documented((201, "the key, with its secret"), OPERATORS))
def create_key(body: NewKey) -> Response[IssuedKey]:
    made = apps.create_key(current_operator(router), body.name)
    return Response(201, content_types.APPLICATION_JSON, IssuedKey.model_validate(made))


@router.get("/v1/operator/keys", operation_id="listKeys", tags=["operator"], summary="the app's API keys",
            description="Newest first, revoked ones too; never a key's secret (its prefix tells keys apart).",
            responses=documented((200, "the keys"), OPERATORS))
def list_keys() -> ApiKeyList:
    return ApiKeyList.model_validate({"keys": app_store.keys(current_operator(router))})


@router.post("/v1/operator/keys/<key_id>/rotate", operation_id="rotateKey", tags=["operator"],
             summary="a new API key in place of one of the app's live keys",
             description="The new key keeps the old one's name; the old key is revoked in the same transaction, so "
                         "it is refused from this answer on (the old key's `replaced_by` names the new one). A "
                         "request that comes with the old key may rotate it.",
             responses=documented((201, "the new key, with its secret"), OPERATORS, _NOT_LIVE))
def rotate_key(key_id: UUID) -> Response[IssuedKey]:
    made = apps.rotate_key(current_operator(router), key_id)
    if made is None:
        raise _not_live(key_id)
    return Response(201, content_types.APPLICATION_JSON, IssuedKey.model_validate(made))


@router.delete("/v1/operator/keys/<key_id>", operation_id="revokeKey", tags=["operator"],
               summary="revoke one of the app's API keys",
               description="Refused from this answer on; it stays listed, with `revoked_at`.",
               responses=documented((204, "revoked"), OPERATORS, _NOT_LIVE))
def revoke_key(key_id: UUID):
    if apps.revoke_key(current_operator(router), key_id) is None:
        raise _not_live(key_id)
    return Response(204, None, "")


@router.get("/v1/operator/usage", operation_id="getAppUsage", tags=["operator"],
            summary="every user of the app's usage and its estimated cost",
            description="Per user (named by their subject, as the app knows them) the tokens the budget counted, "
                        "provider calls and tokens per purpose, and a cost estimated at the configured list prices, "
                        f"costliest first; and the app's totals. The dates as GET /v1/usage takes them: without, the "
                        f"last {usage.DEFAULT_DAYS} days; at most {usage.MAX_DAYS} days; a bad date or range is a "
                        "422 naming the parameter.",
            responses=documented((200, "the report"), OPERATORS))
def app_usage(first: Annotated[date | None, Query(alias="from", description="first UTC day (YYYY-MM-DD)")] = None,
              last: Annotated[date | None, Query(alias="to", description="last UTC day, included")] = None
              ) -> AppUsageReport:
    caller_app = current_operator(router)
    first, last = usage.days_of(first, last)
    return AppUsageReport.model_validate(usage.by_user(caller_app, first, last))


_NO_WEBHOOK = (404, "the app has no webhook")


@router.put("/v1/operator/webhook", operation_id="setWebhook", tags=["operator"],
            summary="set where the app's memory events are posted, signed",
            description="Each memory event of the app's users is posted to `url` (docs/EVENTS.md, \"Webhooks\"), "
                        "signed with the webhook's secret. The answer has the `secret` when the webhook is made or "
                        "`rotate_secret` is true, shown this once: keep it to verify the signatures. Changing the url "
                        "alone keeps the secret (the answer has none).",
            responses=documented((200, "the webhook; its secret when it was made or rotated"), OPERATORS))
def set_webhook(body: NewWebhook) -> WebhookSet:
    return WebhookSet.model_validate(webhooks.set_webhook(current_operator(router), body.url, body.rotate_secret,
                                                          settings()))


@router.get("/v1/operator/webhook", operation_id="getWebhook", tags=["operator"], summary="the app's webhook",
            description="Its url and the deliveries waiting and dead; never its secret.",
            responses=documented((200, "the webhook"), OPERATORS, _NO_WEBHOOK))
def get_webhook() -> Webhook:
    found = webhooks.show(current_operator(router))
    if found is None:
        raise errors.NotFound("the app has no webhook")
    return Webhook.model_validate(found)


@router.delete("/v1/operator/webhook", operation_id="deleteWebhook", tags=["operator"],
               summary="stop posting the app's events",
               description="The deliveries not made yet (dead ones too) are dropped with it.",
               responses=documented((204, "deleted"), OPERATORS, _NO_WEBHOOK))
def delete_webhook():
    if not webhooks.delete(current_operator(router)):
        raise errors.NotFound("the app has no webhook")
    return Response(204, None, "")


@router.post("/v1/operator/webhook/redrive", operation_id="redriveWebhook", tags=["operator"],
             summary="send the dead deliveries again",
             description="Every delivery given up on after WEBHOOK_MAX_ATTEMPTS is due again now, with fresh "
                         "attempts: the next sweep posts them.",
             responses=documented((200, "how many are due again"), OPERATORS, _NO_WEBHOOK))
def redrive_webhook() -> Redriven:
    caller_app = current_operator(router)
    if webhooks.show(caller_app) is None:
        raise errors.NotFound("the app has no webhook")
    return Redriven(redriven=webhooks.redrive(caller_app))
