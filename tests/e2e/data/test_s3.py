"""Object storage for real: an S3-compatible server (moto's server mode) on loopback, prepare straight to
``s3://``, reuse of a finished remote prepare, streaming the shards back token-exact, and a training run that
streams from the bucket. Skipped with the reason when moto or boto3 is not installed (the ``test`` extra has them).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from tiny_run import tiny_fit

from lightning_cqk.data import Manifest, TokenDataModule, prepare, remote

pytest.importorskip("boto3", reason="S3 tests need boto3 (pip install -e '.[test]')")
moto_server = pytest.importorskip("moto.server", reason="S3 tests need moto[server] (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1 (a free port), and the AWS environment that points boto3 and litdata at it."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "DISABLE_S5CMD": "1",  # litdata: use boto3, not an s5cmd binary that may be on PATH
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield env["AWS_ENDPOINT_URL"]
    server.stop()


@pytest.fixture()
def bucket(s3_endpoint: str) -> str:
    import boto3

    name = f"cqk-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}"


def test_prepare_to_s3_streams_back_the_same_tokens(corpus: Path, prepared: Path, bucket: str, read_stream, tmp_path):
    url = f"{bucket}/shards/bytes"
    manifest = prepare(str(corpus), url, val_fraction=0.25)
    assert Manifest.exists(url) and remote.exists(f"{url}/train/index.json")
    assert Manifest.load(url).splits == Manifest.load(prepared).splits == manifest.splits
    for split in ("train", "val"):  # litdata's own streaming from the bucket, through its cache
        streamed = read_stream(f"{url}/{split}")
        assert np.array_equal(streamed, read_stream(prepared / split)), split
    again = prepare(str(corpus), url, val_fraction=0.25)  # a finished remote prepare is reused ...
    assert again.created == manifest.created
    with pytest.raises(ValueError, match="other settings"):  # ... and refused with other settings
        prepare(str(corpus), url, val_fraction=0.5)


def test_datamodule_from_s3_batches_match_local(corpus: Path, prepared: Path, bucket: str, tmp_path: Path):
    url = f"{bucket}/uploaded"
    remote.upload_dir(prepared, url, last=("manifest.json",))
    kw = dict(source=None, seq_len=16, batch_size=3, shuffle=False)
    from_s3 = TokenDataModule(data_dir=url, cache_dir=str(tmp_path / "cache"), num_workers=1, **kw)
    from_s3.prepare_data()  # the remote manifest says "finished": nothing to do
    # The remote shards are compared with data.source like local ones: the same source is accepted, another refused.
    TokenDataModule(data_dir=url, source=str(corpus), val_fraction=0.25).prepare_data()
    with pytest.raises(ValueError, match=rf"data\.source does not match the shards in data\.data_dir={url}.*val_fr"):
        TokenDataModule(data_dir=url, source=str(corpus), val_fraction=0.5).prepare_data()
    from_s3.setup("fit")
    local = TokenDataModule(data_dir=str(prepared), **kw)
    local.setup("fit")
    assert [b.tolist() for b in from_s3.train_dataloader()] == [b.tolist() for b in local.train_dataloader()]
    assert [b.tolist() for b in from_s3.val_dataloader()] == [b.tolist() for b in local.val_dataloader()]
    assert from_s3.bytes_per_token == local.bytes_per_token


def test_training_run_streams_from_s3(corpus: Path, bucket: str, tmp_path: Path, monkeypatch):
    from lightning_cqk.cli import main

    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    url = f"{bucket}/train-run"
    main(
        tiny_fit(
            url,  # prepared by the DataModule straight into the bucket, then streamed
            tmp_path / "runs",
            f"--data.source={corpus}",
            f"--data.cache_dir={tmp_path / 'cache'}",
            "--data.val_fraction=0.25",
            "--data.num_workers=1",
            "--trainer.max_steps=3",
            "--trainer.val_check_interval=3",
            "--trainer.limit_val_batches=2",
        )
    )
    assert Manifest.exists(url)
    (budget,) = (tmp_path / "runs").rglob("budget.json")
    assert json.loads(budget.read_text())["steps"] == 3
    assert any((tmp_path / "cache").rglob("*.bin")), "chunks came through litdata's cache"


def test_plain_http_is_allowed_only_for_an_http_endpoint(monkeypatch):
    from litdata.streaming import downloader

    monkeypatch.setattr(downloader, "_OBSTORE_CLIENT_OPTIONS", {"timeout": "200s"})
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://minio.example:9000")
    remote.allow_http_endpoints()
    assert "allow_http" not in downloader._OBSTORE_CLIENT_OPTIONS
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    remote.allow_http_endpoints()
    assert downloader._OBSTORE_CLIENT_OPTIONS == {"timeout": "200s", "allow_http": True}
    assert remote.join("s3://b/p/", "train", "index.json") == "s3://b/p/train/index.json"
    assert not remote.is_remote("/data/shards") and remote.is_remote("s3://b/p")
