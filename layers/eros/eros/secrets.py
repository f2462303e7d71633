"""Turns the settings' secret ARNs into usable values (AWS), or passes local values through.

In AWS the database credentials and the provider keys live in Secrets Manager; Powertools
Parameters caches them per container (``max_age``) so a warm invocation makes no call.
"""

from __future__ import annotations

from aws_lambda_powertools.utilities import parameters
from psycopg.conninfo import make_conninfo
from pydantic import SecretStr

from .config import Settings

SECRET_MAX_AGE_SECS = 300


class ConfigurationError(RuntimeError):
    """The deployment is missing something it needs (no database configured, a malformed secret)."""


def _json_secret(arn: str) -> dict:
    try:
        value = parameters.get_secret(arn, transform="json", max_age=SECRET_MAX_AGE_SECS)
    except parameters.TransformParameterError:
        raise ConfigurationError(f"secret {arn} is not valid JSON") from None  # never echo the secret text
    if not isinstance(value, dict):
        raise ConfigurationError(f"secret {arn} is not a JSON object")
    return value


def with_provider_keys(settings: Settings) -> Settings:
    """Fill the provider keys from the provider secret, if one is configured."""
    if not settings.provider_secret_arn:
        return settings
    secret = _json_secret(settings.provider_secret_arn)
    updates = {}
    for field in ("openrouter_api_key", "voyage_api_key"):
        value = secret.get(field.upper()) or secret.get(field)
        if value:
            updates[field] = SecretStr(str(value))
    return settings.model_copy(update=updates)


def database_dsn(settings: Settings) -> str:
    """The libpq connection string: DATABASE_URL locally, the RDS secret (and proxy host) in AWS."""
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    if not settings.database_secret_arn:
        raise ConfigurationError("no database configured: set DATABASE_URL or DATABASE_SECRET_ARN")
    secret = _json_secret(settings.database_secret_arn)
    required = {"host": settings.database_host or secret.get("host"), "username": secret.get("username"),
                "password": secret.get("password")}
    missing = [name for name, value in required.items() if value is None or value == ""]
    if missing:  # a null or empty field is as missing as an absent one (libpq would silently drop it)
        raise ConfigurationError(f"database secret lacks {', '.join(map(repr, missing))}")
    return make_conninfo(
        host=str(required["host"]),
        port=str(secret.get("port") or 5432),
        user=str(required["username"]),
        password=str(required["password"]),
        dbname=str(secret.get("dbname") or "postgres"),
        sslmode="require",
    )
