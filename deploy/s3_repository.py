"""Upload a built model repository to S3 (or any S3-compatible store), where
Triton's `--model-repository=s3://...` reads it (`make upload-repository`):

    python deploy/s3_repository.py model_repository s3://my-bucket/models
    python deploy/s3_repository.py model_repository s3://127.0.0.1:9000/my-bucket/models

Credentials and region come from boto3's usual sources (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, ~/.aws). A URL naming `host:port`
before the bucket is Triton's spelling of a custom endpoint (MinIO, a local
server): the upload goes there over HTTP, as Triton will read it. Files are
uploaded under the path as they are laid out on disk, and each empty folder (an
ensemble's version folder) as a zero-byte `<folder>/` object, without which Triton
finds no version of the ensemble; the build's bookkeeping files (fingerprints)
stay behind.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

# s3://[host:port/]bucket[/path], as Triton parses it (a host needs its port).
_S3_URL = re.compile(r"s3://(?:(?P<endpoint>[^/:]+:\d+)/)?(?P<bucket>[^/]+)/?(?P<prefix>.*)")
# Written by the build next to model.onnx to skip unchanged exports; not a model file.
_BUILD_BOOKKEEPING = re.compile(r"^\..*\.fingerprint$")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket's root
    endpoint: str | None = None  # host:port of an S3-compatible server; None for AWS

    @classmethod
    def parse(cls, url: str) -> "S3Location":
        match = _S3_URL.fullmatch(url)
        if not match:
            raise ValueError(f"not an s3:// URL: {url!r} (expected s3://[host:port/]bucket[/path])")
        return cls(match["bucket"], match["prefix"].strip("/"), match["endpoint"])

    @property
    def url(self) -> str:
        host = f"{self.endpoint}/" if self.endpoint else ""
        return f"s3://{host}{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def endpoint_url(self) -> str | None:
        """For boto3: Triton reaches a custom endpoint over plain HTTP."""
        return f"http://{self.endpoint}" if self.endpoint else None

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative


def repository_files(repository: Path) -> list[Path]:
    """Every file Triton needs, relative to the repository, in a stable order."""
    return sorted(
        path.relative_to(repository)
        for path in repository.rglob("*")
        if path.is_file() and not _BUILD_BOOKKEEPING.match(path.name) and "__pycache__" not in path.parts
    )


def empty_folders(repository: Path) -> list[Path]:
    """Folders with nothing in them, relative to the repository: an ensemble's
    version folder is one, and Triton needs it to see that version."""
    return sorted(
        path.relative_to(repository) for path in repository.rglob("*") if path.is_dir() and not any(path.iterdir())
    )


def s3_client(location: S3Location):
    import boto3  # the deploy extra; imported here so that parsing needs no boto3

    return boto3.client("s3", endpoint_url=location.endpoint_url)


def upload(repository: Path, location: S3Location, client=None, create_bucket: bool = False) -> list[str]:
    """Upload `repository`'s files under `location`; returns the keys written."""
    repository = Path(repository)
    files = repository_files(repository)
    if not files:
        raise FileNotFoundError(f"{repository} holds no files: build it first (make build)")
    client = client or s3_client(location)
    if create_bucket:
        existing = {bucket["Name"] for bucket in client.list_buckets().get("Buckets", [])}
        if location.bucket not in existing:
            client.create_bucket(Bucket=location.bucket)
    keys = []
    for relative in files:
        key = location.key(relative.as_posix())
        client.upload_file(str(repository / relative), location.bucket, key)
        keys.append(key)
    for relative in empty_folders(repository):
        # S3 has no folders: a zero-byte object named `<folder>/` stands for one.
        key = location.key(relative.as_posix()) + "/"
        client.put_object(Bucket=location.bucket, Key=key, Body=b"")
        keys.append(key)
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("repository", type=Path, help="a built model repository (make build)")
    parser.add_argument("url", help="s3://[host:port/]bucket[/path]")
    parser.add_argument("--create-bucket", action="store_true", help="create the bucket if it does not exist")
    args = parser.parse_args(argv)
    location = S3Location.parse(args.url)
    keys = upload(args.repository, location, create_bucket=args.create_bucket)
    print(f"uploaded {len(keys)} files to {location.url}")
    print(f"serve with: tritonserver --model-repository={location.url}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
