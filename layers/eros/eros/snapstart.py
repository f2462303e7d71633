"""Lambda SnapStart (template.yaml: ChatColdStart=snapstart): what the snapshot keeps, what a restore redoes.

With SnapStart, Lambda runs the function's initialisation once, when a version is published, and starts
every new container from a snapshot of that process. So the snapshot should hold everything a first
request would otherwise import, and nothing that must be one container's own:

* ``warm`` (before the snapshot) imports what the chat function's first request reaches for lazily in AWS:
  boto3 and Powertools' secrets provider, with botocore patched for X-Ray. It opens no connection, reads
  no secret and makes no client: those would be frozen into every copy of the snapshot.
* ``renew`` (after each restore) drops what a copy must not share: the database connection, what it said of the
  embedding space (eros.calibrated) and the providers' HTTP clients (none is open at the snapshot, but a hook is
  cheaper than a proof), the TLS context (OpenSSL's state), and the ``random`` generator's state, which the backoff
  jitter uses: restored copies would otherwise all draw the same "random" delays and retry in step.

The runtime provides ``snapshot_restore_py``; elsewhere (the local stack, a function without SnapStart)
registering does nothing.
"""

from __future__ import annotations

import random


def register() -> bool:
    """Register the hooks with the runtime's SnapStart library, if there is one; returns whether it did."""
    try:
        from snapshot_restore_py import register_after_restore, register_before_snapshot
    except ImportError:
        return False
    register_before_snapshot(warm)
    register_after_restore(renew)
    return True


def warm() -> None:
    from aws_lambda_powertools.utilities import parameters  # noqa: F401  (imports boto3)

    from .observability import trace_aws_calls

    trace_aws_calls()


def renew() -> None:
    from . import calibrated, db, providers
    from .providers.base import tls_context

    db.reset()
    providers.reset()
    calibrated.reset()  # what the database said of the embedding space, timed by a clock the restore jumps
    tls_context.cache_clear()
    random.seed()
