"""The model repository in object storage, for real: a local S3 server (moto, in
server mode on a free loopback port), the built repository uploaded with
deploy/s3_repository.py, and our launcher started on
`s3://127.0.0.1:<port>/<bucket>/<path>`. Triton fetches the models into a
temporary folder of its own; the ensemble must classify the photos exactly as
the session's server does from the local folder."""

from __future__ import annotations

import logging

import boto3
import pytest
from moto.server import ThreadedMotoServer

from deploy.s3_repository import S3Location, empty_folders, repository_files, upload
from tests.chart import free_server_ports, pod_environment, render, serve_rendered, triton_container
from tritonstack.client.classifier import ClassifierClient
from tritonstack.contract import DEFAULT_MODEL, DEFAULT_PRESET, preprocessing_name
from tritonstack.samples.photos import PHOTOS, photo_bytes
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.network import LOOPBACK, free_port
from tritonstack.serve.server_config import ServerConfig

BUCKET = "models"
PREFIX = "image-classifier/v1"
# What the ensemble needs: loading only these keeps the download and the start short.
MODELS = (DEFAULT_MODEL, preprocessing_name(DEFAULT_PRESET), "efficientnet_lite0")


@pytest.fixture(scope="module")
def s3_endpoint(monkeypatch_module):
    port = free_port(LOOPBACK)
    moto = ThreadedMotoServer(ip_address=LOOPBACK, port=port, verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per S3 request otherwise
    # Triton's S3 client and boto3 both read these; moto accepts any credentials.
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test-key-id"),
        ("AWS_SECRET_ACCESS_KEY", "test-secret"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch_module.setenv(name, value)
    moto.start()
    try:
        yield f"{LOOPBACK}:{port}"
    finally:
        moto.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def uploaded(s3_endpoint, model_repository) -> S3Location:
    location = S3Location.parse(f"s3://{s3_endpoint}/{BUCKET}/{PREFIX}")
    upload(model_repository, location, create_bucket=True)
    return location


def test_url_forms_parse_as_triton_reads_them():
    assert S3Location.parse("s3://bucket") == S3Location("bucket", "")
    assert S3Location.parse("s3://bucket/a/b/") == S3Location("bucket", "a/b")
    custom = S3Location.parse("s3://127.0.0.1:9000/bucket/a")
    assert (custom.endpoint_url, custom.bucket, custom.key("m/1/x")) == ("http://127.0.0.1:9000", "bucket", "a/m/1/x")
    assert custom.url == "s3://127.0.0.1:9000/bucket/a"
    with pytest.raises(ValueError):
        S3Location.parse("gs://bucket/a")


def test_upload_writes_every_repository_file(uploaded, model_repository):
    client = boto3.client("s3", endpoint_url=uploaded.endpoint_url)
    listed = {
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=uploaded.bucket, Prefix=uploaded.prefix)
        for item in page.get("Contents", [])
    }
    expected = {uploaded.key(path.as_posix()) for path in repository_files(model_repository)}
    folders = {uploaded.key(path.as_posix()) + "/" for path in empty_folders(model_repository)}
    assert uploaded.key(f"{DEFAULT_MODEL}/1") + "/" in folders  # the ensemble's version
    assert listed == expected | folders
    assert uploaded.key("efficientnet_lite0/1/model.onnx") in listed
    assert not any(key.endswith(".fingerprint") for key in listed)


def test_served_from_s3_classifies_as_from_the_local_folder(uploaded, server):
    photos = sorted(PHOTOS)
    images = [photo_bytes(name) for name in photos]
    with ClassifierClient(server.grpc_url, "grpc") as local:
        expected = local.classify(images, top_k=5)

    load = [f"--load-model={name}" for name in MODELS]
    with TritonServer(
        ServerConfig(uploaded.url, extra_args=("--model-control-mode=explicit", *load)), startup_timeout_s=120
    ) as from_s3:
        with ClassifierClient(from_s3.grpc_url, "grpc") as remote:
            served = remote.classify(images, top_k=5)

    assert [[(p.index, p.label) for p in top] for top in served] == [
        [(p.index, p.label) for p in top] for top in expected
    ]
    assert [[p.score for p in top] for top in served] == [[p.score for p in top] for top in expected]
    # And it is the right answer, where the photo has a known one (not merely the same).
    known = [(name, top) for name, top in zip(photos, served) if PHOTOS[name]]
    assert known and all(top[0].label in PHOTOS[name] for name, top in known), known


def test_the_charts_cpu_mode_serves_from_s3_with_credentials_from_its_secret(uploaded, tmp_path):
    """The chart's rendered server (cpu mode) on the uploaded repository: the S3
    URL, region and credentials reach tritonserver only through the pod's
    variables (the Secret's values given here), none from this process."""
    container = triton_container(render("cpu", f"modelRepository.s3.url={uploaded.url}", *free_server_ports()))
    given = {
        ("image-classifier-admin", "admin-key"): "k" * 24,
        ("image-classifier-s3", "AWS_ACCESS_KEY_ID"): "test-key-id",
        ("image-classifier-s3", "AWS_SECRET_ACCESS_KEY"): "test-secret",
    }
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(
        pod_environment(container, given)
    )
    with serve_rendered(container, given, tmp_path) as served:
        with ClassifierClient(served.grpc_url, "grpc") as client:
            top = client.classify([photo_bytes("coffee.png")], top_k=1)[0]
    assert top[0].label in PHOTOS["coffee.png"]
