"""A user's whole record, in their hands: the export (``GET /v1/export``) and erasure (``DELETE /v1/me``,
``eros forget``); and an app's deletion (``eros apps delete``), which erases each of its users that way.

An export is too big for a Lambda response (6 MB through API Gateway; a user with 100,000 messages has
tens of MB), so it is written where the user can fetch it: in AWS an S3 object (EXPORT_BUCKET, uploaded in
parts as the document is produced, encrypted, expiring), fetched with a presigned URL valid for
``URL_SECS``; locally a file in EXPORT_DIR that the local stack serves (``eros_dev.server``). Either way the
document is produced a page of rows at a time (``store.account.export_document``) and never held whole.
Objects are named ``exports/<owner>/<time>-<random>.json``; ``owner`` is a hash of the user id (a key
names no user), and erasure deletes that prefix with the rows.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from . import clock
from .config import Settings, settings
from .errors import ClientError
from .observability import logger, trace_aws_calls
from .store import account as account_store

URL_SECS = 900
PART_BYTES = 8 * 1024 * 1024  # S3 multipart parts (at least 5 MB each but the last)


class ExportsNotConfigured(ClientError):
    """Neither EXPORT_BUCKET (AWS) nor EXPORT_DIR (the local stack) is set."""
    status, code = 503, "exports_unavailable"


@dataclass
class Export:
    url: str
    expires_at: datetime
    bytes: int


def owner(user_id: str) -> str:
    return hashlib.sha256(user_id.encode()).hexdigest()[:32]


def export(user_id: str) -> Export:
    cfg, now = settings(), clock.now()
    key = f"exports/{owner(user_id)}/{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex}.json"
    document = _encoded(account_store.export_document(user_id, now))
    if cfg.export_bucket:
        size = _upload(cfg.export_bucket, key, document)
        url = _s3().generate_presigned_url("get_object", ExpiresIn=URL_SECS, Params={
            "Bucket": cfg.export_bucket, "Key": key,
            "ResponseContentDisposition": 'attachment; filename="eros-export.json"'})
    elif cfg.export_dir and cfg.export_base_url:
        size = _write(Path(cfg.export_dir) / key, document)
        url = f"{cfg.export_base_url.rstrip('/')}/{key}"
    else:
        raise ExportsNotConfigured("exports are not configured here (EXPORT_BUCKET)")
    logger.info("export written", extra={"bytes": size})
    return Export(url, now + timedelta(seconds=URL_SECS), size)


def erase(user_id: str) -> dict[str, int]:
    """Every row of the user (``store.account.erase``), then their export files; returns the counts."""
    erased = account_store.erase(user_id)
    return erased | {"exports": _forget_exports(settings(), owner(user_id))}


class AppNotDeletable(ClientError):
    """An app that cannot be deleted: the first app, or one that does not exist."""
    status, code = 409, "app_not_deletable"


ERASE_PASSES = 3  # an app's users looked for again after they are erased: a request let in before may have written


@dataclass
class AppErasure:
    users: int  # the app's users erased, each as ``erase`` erases one
    erased: dict[str, int]  # their rows and export files, by kind, summed over them
    leftovers: dict[str, int]  # then the app's own rows: events, personas and their versions, keys, the app
    scan: dict[str, int]  # what is left of the app in each table afterwards (``account_store.scan``): all zeros


def erase_app(app: str) -> AppErasure:
    """Delete an app whole (an operator's act at the command line, with the migration credentials): mark it as
    being deleted, from when on none of its tokens or keys is accepted (eros.apps); erase each of its users as
    ``erase`` erases one (their locks taken, their export files deleted too), looking again for users a request
    let in before the mark has written; then the app's own rows. Returns the counts and the scan of what is left
    of the app. An interrupted deletion is finished by running it again."""
    from .apps import DEFAULT

    if app == DEFAULT:
        raise AppNotDeletable(f"the first app, {DEFAULT}, cannot be deleted: a token that names no app is its"
                              " user's")
    if not account_store.begin_app_deletion(app):
        raise AppNotDeletable(f"there is no app {app!r} (`eros apps list` lists them)")
    erased: dict[str, int] = {}
    users: set[str] = set()
    for _ in range(ERASE_PASSES):
        found = account_store.app_users(app)
        if not found:
            break
        for user in found:
            users.add(user)
            for kind, count in erase(user).items():
                erased[kind] = erased.get(kind, 0) + count
    leftovers = account_store.erase_app_rows(app)
    logger.info("app deleted", extra={"app": app, "users": len(users)})
    return AppErasure(len(users), erased, leftovers, account_store.scan(app))


class NoSuchApp(ClientError):
    status, code = 404, "not_found"


@dataclass
class AppExport:
    users: int
    bytes: int


def export_app(app: str, out: BinaryIO) -> AppExport:
    """An app's whole record, for its operator to take away (``eros apps export``): JSON lines, the first the app
    (its id, name, settings and personas, with their prompts), then one line per user of the app, each the
    document ``GET /v1/export`` gives that user (produced a page of rows at a time, as theirs is)."""
    from .store import apps as app_store
    from .store import personas as persona_store

    found = app_store.find(app)
    if found is None:
        raise NoSuchApp(f"there is no app {app!r} (`eros apps list` lists them)")
    now, written = clock.now(), 0
    header = {"app": found["id"], "name": found["name"], "settings": found["settings"],
              "created_at": found["created_at"].isoformat(), "exported_at": now.isoformat(),
              "personas": persona_store.app_personas(app)}
    for chunk in _encoded([account_store.to_json(header), "\n"]):
        written += out.write(chunk)
    users = account_store.app_users(app)
    for user in users:
        for chunk in _encoded([*account_store.export_document(user, now), "\n"]):
            written += out.write(chunk)
    logger.info("app exported", extra={"app": app, "users": len(users), "bytes": written})
    return AppExport(len(users), written)


def app_stored(app: str) -> tuple[int, dict[str, int]]:
    """What ``erase_app`` would delete now: the app's users, and its rows in each table (``account_store.scan``)."""
    return len(account_store.app_users(app)), account_store.scan(app)


def stored(user_id: str) -> dict[str, int]:
    """What ``erase`` would erase now, by kind: the user's rows (``store.account.stored``) and export files."""
    return account_store.stored(user_id) | {"exports": _exports(settings(), owner(user_id))}


def _encoded(pieces: Iterable[str]) -> Iterator[bytes]:
    """The document's pieces as UTF-8 chunks of about 64 KiB (fewer, larger writes)."""
    buffer: list[str] = []
    size = 0
    for piece in pieces:
        buffer.append(piece)
        size += len(piece)
        if size >= 65536:
            yield "".join(buffer).encode()
            buffer, size = [], 0
    yield "".join(buffer).encode()


def _write(path: Path, chunks: Iterable[bytes]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    with path.open("wb") as out:
        for chunk in chunks:
            out.write(chunk)
            size += len(chunk)
    return size


def _s3():
    import boto3  # the runtime's; only an export needs it
    from botocore.config import Config

    trace_aws_calls()
    return boto3.client("s3", config=Config(signature_version="s3v4"))  # presigned URLs signed with SigV4


def _upload(bucket: str, key: str, chunks: Iterable[bytes]) -> int:
    """Upload as the chunks come: one PUT if the whole is smaller than a part, else a multipart upload
    (aborted if anything fails, so no half document is left behind)."""
    client, part, size = _s3(), bytearray(), 0
    upload: str | None = None
    parts: list[dict] = []
    for chunk in chunks:
        part += chunk
        size += len(chunk)
        if len(part) >= PART_BYTES:
            upload = upload or client.create_multipart_upload(Bucket=bucket, Key=key,
                                                              ContentType="application/json")["UploadId"]
            parts.append(_part(client, bucket, key, upload, len(parts) + 1, bytes(part)))
            part = bytearray()
    if upload is None:
        client.put_object(Bucket=bucket, Key=key, Body=bytes(part), ContentType="application/json")
        return size
    try:
        if part:
            parts.append(_part(client, bucket, key, upload, len(parts) + 1, bytes(part)))
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
    except Exception:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
        raise
    return size


def _part(client, bucket: str, key: str, upload: str, number: int, body: bytes) -> dict:
    etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=body)["ETag"]
    return {"PartNumber": number, "ETag": etag}


def _exports(cfg: Settings, prefix_owner: str) -> int:
    """How many export files the owner has (what ``_forget_exports`` would delete)."""
    prefix = f"exports/{prefix_owner}/"
    if cfg.export_bucket:
        pages = _s3().get_paginator("list_objects_v2").paginate(Bucket=cfg.export_bucket, Prefix=prefix)
        return sum(len(page.get("Contents", [])) for page in pages)
    folder = Path(cfg.export_dir) / prefix if cfg.export_dir else None
    return len(list(folder.glob("*.json"))) if folder and folder.is_dir() else 0


def _forget_exports(cfg: Settings, prefix_owner: str) -> int:
    prefix = f"exports/{prefix_owner}/"
    if cfg.export_bucket:
        client, gone = _s3(), 0
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=cfg.export_bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=cfg.export_bucket, Delete={"Objects": keys, "Quiet": True})
                gone += len(keys)
        return gone
    if cfg.export_dir:
        folder = Path(cfg.export_dir) / prefix
        files = list(folder.glob("*.json")) if folder.is_dir() else []
        for file in files:
            file.unlink()
        return len(files)
    return 0
