"""Shard directories in object storage (``s3://bucket/prefix``): the few reads and writes outside litdata.

litdata streams the chunks itself (``StreamingDataset("s3://...")`` downloads each rank's chunks into its cache).
What remains is ours: reading ``manifest.json`` and ``index.json`` before streaming, and uploading a prepared
directory. ``prepare`` writes locally and uploads ``train/`` and ``val/`` first and ``manifest.json`` last, so a
bucket prefix with a manifest is a finished prepare there too, exactly as on disk.

Credentials and endpoint come from the standard AWS environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for S3-compatible servers such as MinIO or moto), read by boto3 here and
by litdata's S3 client when streaming. litdata fetches chunks through ``obstore`` when it is installed, and obstore
refuses plain-http endpoints; ``allow_http_endpoints()`` lets it use them (for a server on loopback or a private
network), and is called when ``AWS_ENDPOINT_URL`` starts with ``http://``.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

REMOTE_SCHEMES = ("s3",)


def is_remote(path: str | os.PathLike) -> bool:
    """Whether ``path`` names object storage (``s3://...``) rather than a local directory."""
    return urlparse(str(path)).scheme in REMOTE_SCHEMES


def join(base: str | os.PathLike, *names: str) -> str:
    """``base/names...`` for URLs and local paths alike (``Path`` would fold ``s3://`` into ``s3:/``)."""
    if is_remote(base):
        return "/".join([str(base).rstrip("/"), *names])
    return str(Path(base, *names))


def _client():
    import boto3

    allow_http_endpoints()
    return boto3.client("s3")  # endpoint, region and keys from the AWS environment variables


def _split(url: str) -> tuple[str, str]:
    parsed = urlparse(url)
    return parsed.netloc, parsed.path.lstrip("/")


def exists(url: str) -> bool:
    """Whether the object ``url`` exists."""
    from botocore.exceptions import ClientError

    bucket, key = _split(url)
    try:
        _client().head_object(Bucket=bucket, Key=key)
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def read_text(url: str) -> str:
    """The UTF-8 text of the object ``url``."""
    bucket, key = _split(url)
    return _client().get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")


def upload_dir(local: str | Path, url: str, last: tuple[str, ...] = ()) -> int:
    """Upload every file under ``local`` to the prefix ``url`` (files named in ``last`` after all others).

    Returns:
        The number of bytes uploaded.
    """
    client = _client()
    bucket, prefix = _split(url)
    local = Path(local)
    files = sorted(p for p in local.rglob("*") if p.is_file())
    files = [p for p in files if p.name not in last] + [p for p in files if p.name in last]
    for path in files:
        key = "/".join(filter(None, [prefix.rstrip("/"), *path.relative_to(local).parts]))
        client.upload_file(str(path), bucket, key)
    return sum(p.stat().st_size for p in files)


def allow_http_endpoints() -> None:
    """Let litdata's obstore path use a plain-http ``AWS_ENDPOINT_URL`` (obstore refuses http by default).

    litdata builds its obstore ``S3Store`` with fixed client options; this adds ``allow_http`` to them only when the
    configured endpoint is http, so https endpoints keep obstore's default refusal.
    """
    if not os.environ.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        return
    try:
        from litdata.streaming import downloader
    except ImportError:  # pragma: no cover - litdata is a dependency
        return
    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict) and not options.get("allow_http"):
        downloader._OBSTORE_CLIENT_OPTIONS = {**options, "allow_http": True}
