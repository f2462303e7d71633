"""Signed webhooks (issue 32): an app's memory events posted to its own HTTPS endpoint (docs/EVENTS.md "Webhooks").

The events' drain (eros.events.publish_pending) writes one delivery per event of an app with an endpoint, in its own
transaction: exactly once. Each sweep then ``deliver``s the due ones: it claims them with a lease (committed first,
so a concurrent sweep leaves them), posts each, and records the outcome. At least once: a sweep stopped between a
post and its record posts it again once the lease is over, with the same ``webhook-id`` (the event's id). A failed
post is tried again after an exponential backoff with jitter; after WEBHOOK_MAX_ATTEMPTS it is dead (a dead letter)
until the operator redrives it. Order per user: ``seq`` (a retried event may come after a later one).

Signatures follow the Standard Webhooks convention: ``webhook-signature: v1,<base64 HMAC-SHA256>`` of
``{webhook-id}.{webhook-timestamp}.{body}``, keyed by the secret's bytes (``whsec_`` + base64 of 32 random bytes).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import random
import secrets
import socket
import time
from datetime import timedelta
from urllib.parse import urlsplit

import httpx

from . import clock
from .config import Settings
from .observability import logger, metrics
from .store import webhooks as store

SECRET_PREFIX = "whsec_"
MAX_URL = 2000
KEEP_DELIVERED = timedelta(days=1)  # a delivered row (its payload is the user's data) is forgotten after this
MAX_ERROR = 300  # characters of an attempt's error kept (never the response's body)


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header's value for one delivery."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def refused_url(url: str, cfg: Settings) -> str | None:
    """Why ``url`` cannot be an endpoint (None: it can). https only (http with WEBHOOK_ALLOW_HTTP), no credentials,
    no fragment, at most MAX_URL characters, and no IP literal of a private, loopback, link-local or otherwise
    unroutable range (the cloud's metadata address among them) unless WEBHOOK_ALLOW_HTTP. A DNS name is not resolved
    here: one that resolves to a private address is not refused (docs/EVENTS.md says so)."""
    if len(url) > MAX_URL:
        return f"at most {MAX_URL} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not one
    except ValueError as exc:
        return f"not a URL ({exc})"
    allowed = ("https", "http") if cfg.webhook_allow_http else ("https",)
    if parts.scheme not in allowed:
        return "must be an https URL"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (the signature authenticates the engine)"
    if parts.fragment or url.endswith("#"):
        return "must not have a fragment"
    if any(c.isspace() for c in url):
        return "must not contain spaces"
    if cfg.webhook_allow_http:
        return None
    address = _ip_literal(parts.hostname)
    if (address is not None and not address.is_global) or parts.hostname.rstrip(".") == "localhost" \
            or parts.hostname.rstrip(".").endswith(".localhost"):
        return "must not be a private, loopback or link-local address"
    return None


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as the address it names when it is an IP literal, in any form a resolver takes for one (IPv4 in
    decimal, octal or hex parts, "2130706433" or "0x7f.1", as inet_aton reads them; an IPv4-mapped IPv6 address as
    its IPv4 one); None for a DNS name."""
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host)
    except ValueError:
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def set_webhook(app: str, url: str, rotate_secret: bool, cfg: Settings) -> dict:
    """Set the app's endpoint; its answer has ``secret`` when it was made or its secret rotated (shown this once)."""
    why = refused_url(url, cfg)
    if why:
        raise ValueError(f"url: {why}")
    row = store.set_webhook(app, url, new_secret(), rotate_secret)
    shown = row["made"] or rotate_secret
    logger.info("webhook set", extra={"app": app, "made": row["made"], "rotated": rotate_secret})
    answer = {k: row[k] for k in ("url", "created_at", "secret_rotated_at")}
    return answer | ({"secret": row["secret"]} if shown else {})


def retry_delay(attempts: int, cfg: Settings) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: exponential from WEBHOOK_RETRY_BASE_SECS, at
    most WEBHOOK_RETRY_MAX_DELAY_SECS, with full jitter over its upper half (so failures of one endpoint spread)."""
    ceiling = min(cfg.webhook_retry_max_delay_secs, cfg.webhook_retry_base_secs * 2 ** max(0, attempts - 1))
    return ceiling / 2 + random.random() * ceiling / 2  # noqa: S311 - jitter, not a secret


def post(client: httpx.Client, delivery: dict) -> tuple[int | None, str | None]:
    """POST one delivery, signed; (the status, None) or (None, what went wrong). A redirect is not followed."""
    body = json.dumps(delivery["payload"], ensure_ascii=False, separators=(",", ":")).encode()
    webhook_id, timestamp = str(delivery["event_id"]), int(clock.now().timestamp())
    headers = {"content-type": "application/json", "webhook-id": webhook_id, "webhook-timestamp": str(timestamp),
               "webhook-signature": signature(delivery["secret"], webhook_id, timestamp, body),
               "user-agent": "eros-webhooks/1"}
    try:
        answer = client.post(delivery["url"], content=body, headers=headers)
    except httpx.TimeoutException:
        return None, "timed out"
    except httpx.HTTPError as exc:  # its text without the URL (a query may carry the receiver's token)
        return None, f"{type(exc).__name__}: {str(exc).replace(delivery['url'], '<url>')[:MAX_ERROR]}"
    return answer.status_code, None if answer.is_success else f"answered {answer.status_code}"


def deliver(cfg: Settings, client: httpx.Client | None = None) -> int:
    """One sweep's deliveries: claim up to WEBHOOKS_PER_TICK due ones and post each; returns how many were
    delivered. Forgets deliveries made over KEEP_DELIVERED ago."""
    moment = clock.now()
    store.prune(moment - KEEP_DELIVERED)
    lease = moment + timedelta(seconds=cfg.webhook_lease_secs)
    taken = store.claim(moment, lease, cfg.webhooks_per_tick)
    if not taken:
        return 0
    delivered = failed = dead = 0
    started = time.monotonic()
    unreachable: set[str] = set()  # apps whose endpoint did not answer in this pass: the rest of theirs wait
    own = client is None
    client = client or httpx.Client(timeout=cfg.webhook_timeout_secs, follow_redirects=False)
    try:
        for delivery in taken:
            if time.monotonic() - started > cfg.webhook_lease_secs / 2:  # the rest is taken again after the lease
                break
            if delivery["app_id"] in unreachable:  # taken again after the lease, no attempt spent on it
                continue
            status, error = post(client, delivery)
            if status is None:  # a timeout or a refused connection: one app's endpoint holds up no other's
                unreachable.add(delivery["app_id"])
            ok = error is None
            now = clock.now()
            retry_at = now + timedelta(seconds=retry_delay(delivery["attempts"] + 1, cfg))
            gone = store.outcome(delivery, ok=ok, status=status, error=error, now=now, retry_at=retry_at,
                                 max_attempts=cfg.webhook_max_attempts)
            if ok:
                delivered += 1
                continue
            failed += 1
            dead += bool(gone)
            logger.warning("a webhook delivery failed", extra={
                "app": delivery["app_id"], "event_id": delivery["event_id"], "attempt": delivery["attempts"] + 1,
                "status": status, "error": error, "dead": bool(gone)})
    finally:
        if own:
            client.close()
    metrics.add_metric(name="WebhooksDelivered", unit="Count", value=delivered)
    metrics.add_metric(name="WebhooksFailed", unit="Count", value=failed)
    metrics.add_metric(name="WebhooksDead", unit="Count", value=dead)
    return delivered


def show(app: str) -> dict | None:
    return store.find(app)


def delete(app: str) -> bool:
    done = store.delete(app)
    if done:
        logger.info("webhook deleted", extra={"app": app})
    return done


def redrive(app: str) -> int:
    count = store.redrive(app, clock.now())
    logger.info("webhook deliveries redriven", extra={"app": app, "deliveries": count})
    return count

