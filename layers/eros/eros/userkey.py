"""The engine's user key, which names the user's app (eros.apps says why): written by ``user_key``, read by ``split``
(and by the database's ``engine.app_of``). Nothing else builds or reads one. A module of its own, with no imports,
so that the logs (eros.observability) can show a key as people read it without importing the apps."""

from __future__ import annotations

DEFAULT = "default"  # the first app: its users' keys are their bare subjects
SEPARATOR = "\x1f"  # between the app and the subject; refused in a subject (eros.apps.unusable_subject)


def user_key(app: str, subject: str) -> str:
    """The engine's key of ``subject`` in ``app``."""
    return subject if app == DEFAULT else f"{app}{SEPARATOR}{subject}"


def split(key: str) -> tuple[str, str]:
    """(app, subject) of a user key."""
    app, sep, subject = key.partition(SEPARATOR)
    return (app, subject) if sep else (DEFAULT, key)


def app_of(key: str) -> str:
    return split(key)[0]


def subject_of(key: str) -> str:
    return split(key)[1]


def shown(key: str) -> str:
    """A user key for people: the subject, and ``@app`` for a user of another app than the first (``alice@acme``)."""
    app, subject = split(key)
    return subject if app == DEFAULT else f"{subject}@{app}"
