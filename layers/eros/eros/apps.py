"""Apps (tenants, migration 0036): one deployment serves several apps, each with its own users, personas, settings,
usage and API keys, and no app sees another's.

**The user key.** Every table of a user's data is keyed by the engine's user key, and the key names the app: a
user of the first app, ``default``, is the bare subject of their token (as before apps existed); a user of any
other app is ``<app>\\x1f<subject>`` (U+001F, which a subject may not hold: ``unusable_subject``). So every
statement scoped by its user is scoped by its app, and the few that span users say which app they read
(tests/test_shard_ready.py). ``eros.userkey.user_key`` writes keys and ``split`` reads them (``engine.app_of`` in
SQL); nothing else builds one.

**Who the caller is.** An end user's JWT names the app in a claim (``APP_CLAIM``, default ``eros_app``; absent:
the first app); an app's server sends one of the app's API keys (``X-Api-Key``) to the ``/server`` routes, and
names the user it acts for in ``X-Eros-User`` (the key is the app's operator's: it may act for any of the app's
users, and use the app's operator routes). Either way the app must exist and not be being deleted, which is asked
on every request (one index probe): a deleted app's tokens and a revoked key are refused at once.

**Settings.** An app may set some of the deployment's settings for itself (``AppSettings``: limits, budgets,
models, retention); ``settings_for`` is the deployment's settings with the app's over them, read at most
``SETTINGS_CACHE_SECS`` old.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from .config import Settings, settings
from .errors import Unauthorized
from .json_body import unstorable
from .observability import logger
from .store import apps as app_store

# The user key's functions, where the rest of the engine finds them (eros.userkey defines them, import-free).
from .userkey import DEFAULT, SEPARATOR, app_of, user_key
from .userkey import shown as shown
from .userkey import split as split
from .userkey import subject_of as subject_of

APP_ID = re.compile(r"^[a-z][a-z0-9-]{1,39}$")  # engine.apps' CHECK
KEY_PREFIX = "ek_"  # an API key: ek_ and 43 characters of base64url (256 random bits)
KEY_SHOWN = 10  # the characters of a key a listing shows (its prefix)
KEY_PATTERN = re.compile(r"^ek_[A-Za-z0-9_-]{43}$")
SETTINGS_CACHE_SECS = 30.0


class AppSettings(BaseModel):
    """What an app may set for itself over the deployment's settings (``engine.apps.settings``): each field is the
    ``Settings`` field of the same name; unset, the deployment's applies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turns_per_minute: int | None = Field(None, ge=0, description="a user's turns and memory requests a minute")
    daily_token_budget: int | None = Field(None, ge=0, description="a user's provider tokens a UTC day")
    chat_model: str | None = Field(None, min_length=1, max_length=200, pattern=r"^\S+$")
    extract_model: str | None = Field(None, min_length=1, max_length=200, pattern=r"^\S+$")
    transcript_retention_days: int | None = Field(None, ge=0, description="messages kept this long once extracted")
    history_messages: int | None = Field(None, ge=0, le=200)
    chat_max_tokens: int | None = Field(None, ge=16, le=100_000)
    events_include_text: bool | None = Field(None, description="memory events carry the memory's text")

    def overrides(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Caller(NamedTuple):
    """Who a request is from: its app, the user (the engine's key) or None for an app's server acting as the app's
    operator, and whether it may use the operator routes."""

    app: str
    user: str | None
    operator: bool







def unusable_subject(subject: str) -> str | None:
    """Why a token's subject (or a server's X-Eros-User) cannot name a user, or None."""
    if SEPARATOR in subject:
        return "holds the character U+001F, which the engine keeps to join an app and a user"
    return None


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


_cached: dict[str, tuple[float, AppSettings]] = {}


def remember(app: str, raw: dict[str, Any]) -> AppSettings:
    """The app's settings as read from its row, kept for ``settings_for``."""
    kept = AppSettings.model_validate(raw or {})
    _cached[app] = (time.monotonic(), kept)
    return kept


def forget() -> None:
    """Drop what was read of the apps' settings (tests; a process that changed them)."""
    _cached.clear()


def app_settings(app: str) -> AppSettings:
    at, kept = _cached.get(app, (float("-inf"), None))
    if kept is None or time.monotonic() - at > SETTINGS_CACHE_SECS:
        row = app_store.find(app)
        kept = remember(app, row["settings"] if row else {})
    return kept


def settings_for(user: str, base: Settings | None = None) -> Settings:
    """The deployment's settings (or ``base``) with the user's app's over them."""
    base = base or settings()
    overrides = app_settings(app_of(user)).overrides()
    return base.model_copy(update=overrides) if overrides else base


MAX_SUBJECT = 255


def _subject(subject: object, where: str) -> str:
    if not isinstance(subject, str) or not subject or len(subject) > MAX_SUBJECT:
        raise Unauthorized(f"{where} must name the user: 1 to {MAX_SUBJECT} characters")
    problem = unstorable(subject) or unusable_subject(subject)
    if problem:
        raise Unauthorized(f"{where} {problem}")
    return subject


def from_token(claims: dict, cfg: Settings) -> Caller:
    """The caller an end user's verified token names: its app (the ``cfg.app_claim`` claim; the first app
    without one), the user, and the operator scope. The app must exist and not be being deleted."""
    app = claims.get(cfg.app_claim) or DEFAULT
    if not isinstance(app, str) or not APP_ID.fullmatch(app):
        raise Unauthorized(f"the token's {cfg.app_claim} claim is not an app id")
    if app != DEFAULT:  # the first app cannot be deleted: asked of the others only
        row = app_store.find(app)
        if row is None:
            raise Unauthorized(f"the token's app {app!r} is not served here")
        remember(app, row["settings"])
    subject = _subject(claims.get("sub"), "the token's subject")
    operator = cfg.operator_scope in str(claims.get("scope") or "").split()
    return Caller(app, user_key(app, subject), operator)


def from_key(key: str | None, user: str | None) -> tuple[Caller, dict]:
    """The caller an app's server is, by one of the app's live API keys (``X-Api-Key``), acting for ``user`` (its
    ``X-Eros-User``; None: as the app's operator). Also the key's row (its id, for the logs)."""
    if not key:
        raise Unauthorized("the /server routes take one of an app's API keys in the X-Api-Key header")
    row = app_store.identify(key_hash(key)) if KEY_PATTERN.fullmatch(key) else None
    if row is None:
        raise Unauthorized("the API key is not a live key of an app served here")
    remember(row["app_id"], row["settings"])
    app = row["app_id"]
    subject = None if user is None else _subject(user, "X-Eros-User")
    return Caller(app, None if subject is None else user_key(app, subject), True), row



# --- keys --------------------------------------------------------------------------------------------------------
# An app's operator keeps its API keys (GET/POST /v1/operator/keys): a key's secret is made here, answered once, and
# only its SHA-256 (``key_hash``) and its first KEY_SHOWN characters (its prefix, to tell keys apart) are kept. The
# logs name a key by its id, never by its secret.


def _logged(what: str, app: str, key_id: Any) -> None:
    logger.info(what, extra={"app": app, "key_id": str(key_id)})


def create_key(app: str, name: str) -> dict:
    """A new API key of ``app``: its row and, this once, its ``secret``."""
    secret = new_key()
    made = app_store.add_key(app, name, secret[:KEY_SHOWN], key_hash(secret))
    _logged("API key made", app, made["id"])
    return {**made, "secret": secret}


def rotate_key(app: str, key_id: Any) -> dict | None:
    """A new key (its row and, this once, its ``secret``) in place of one of ``app``'s live keys, which is revoked
    in the same transaction: refused from the commit on. None when ``key_id`` is not a live key of ``app`` (another
    app's key answers the same: ids do not leak across apps)."""
    secret = new_key()
    made = app_store.rotate(app, key_id, secret[:KEY_SHOWN], key_hash(secret))
    if made is None:
        return None
    _logged("API key rotated: the old key is revoked", app, key_id)
    _logged("API key made by a rotation", app, made["id"])
    return {**made, "secret": secret}


def revoke_key(app: str, key_id: Any) -> dict | None:
    """Revoke one of ``app``'s live keys (refused from now on); None when it is not one."""
    revoked = app_store.revoke(app, key_id)
    if revoked is not None:
        _logged("API key revoked", app, key_id)
    return revoked
