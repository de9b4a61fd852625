"""Cloud Storage transfers with google-cloud-storage, in parallel; uploads resume.

The laptop side uses google-cloud-storage with the operator's credentials; the VMs use
TensorFlow's own gs:// client with theirs.
"""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tfcluster.errors import ConfigError

MANIFEST = "manifest.json"


def split_url(url: str) -> tuple[str, str]:
    """gs://bucket/some/prefix -> ("bucket", "some/prefix")."""
    if not url.startswith("gs://"):
        raise ConfigError(f"{url!r} is not a gs:// URL")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix.strip("/")


def client(project: str | None = None):
    from google.cloud import storage

    from tfcluster.backends.gcp.cloud.compute import default_credentials

    return storage.Client(project=project, credentials=default_credentials())


@dataclass
class UploadResult:
    # Object names written by this call, the manifest last if it was written.
    uploaded: list[str]
    # Object names already in the bucket with the same size and CRC32C, left alone.
    unchanged: list[str]


def crc32c_of(path: Path) -> str:
    """A file's CRC32C as Cloud Storage reports it: base64 of the big-endian 4 bytes
    (https://cloud.google.com/storage/docs/json_api/v1/objects#resource, crc32c)."""
    import google_crc32c  # Installed with google-cloud-storage, which checks uploads with it.

    checksum = google_crc32c.Checksum()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            checksum.update(block)
    return base64.b64encode(checksum.digest()).decode()


def upload_dir(storage_client, local_dir: Path, url: str, workers: int = 8) -> UploadResult:
    """Upload every file under ``local_dir`` to ``url``, in parallel, skipping those already there
    with the same size and CRC32C: an interrupted upload resumes where it stopped.

    The manifest goes last, so a reader that sees it sees a complete set; when shards have to be
    written under an existing manifest, that manifest is deleted first."""
    bucket_name, prefix = split_url(url)
    bucket = storage_client.bucket(bucket_name)
    files = sorted(p for p in Path(local_dir).rglob("*") if p.is_file())
    remote = {blob.name: blob for blob in
              storage_client.list_blobs(bucket_name, prefix=f"{prefix}/" if prefix else None)}

    def object_name(path: Path) -> str:
        return f"{prefix}/{path.relative_to(local_dir).as_posix()}".lstrip("/")

    def unchanged(path: Path) -> bool:
        blob = remote.get(object_name(path))
        return blob is not None and blob.size == path.stat().st_size and blob.crc32c == crc32c_of(path)

    def upload(path: Path) -> str:
        name = object_name(path)
        # checksum: the client sends the CRC32C and Cloud Storage refuses a corrupted object.
        bucket.blob(name).upload_from_filename(str(path), checksum="crc32c")
        return name

    with ThreadPoolExecutor(max_workers=workers) as pool:
        kept = list(pool.map(unchanged, files))
    shards = [p for p, same in zip(files, kept) if not same and p.name != MANIFEST]
    manifests = [p for p, same in zip(files, kept) if p.name == MANIFEST and (shards or not same)]
    for path in manifests:
        if object_name(path) in remote and shards:
            bucket.blob(object_name(path)).delete()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        uploaded = list(pool.map(upload, shards))
    uploaded += [upload(path) for path in manifests]
    return UploadResult(uploaded=uploaded,
                        unchanged=[object_name(p) for p, same in zip(files, kept) if same and p not in manifests])


def delete_unlisted(storage_client, url: str, keep: set[str], workers: int = 8) -> list[str]:
    """Delete the objects under ``url`` whose name below it is not in ``keep`` (e.g. the shards of an
    earlier conversion that the new manifest does not list). Call it once the new files are in place:
    a reader then never finds a listed file missing. Returns the names deleted."""
    from google.api_core.exceptions import NotFound

    bucket_name, prefix = split_url(url)
    bucket = storage_client.bucket(bucket_name)
    stale = [blob.name for blob in storage_client.list_blobs(bucket_name, prefix=f"{prefix}/" if prefix else None)
             if blob.name[len(prefix):].lstrip("/") not in keep]

    def delete(name: str) -> None:
        try:
            bucket.blob(name).delete()
        except NotFound:  # Gone already (a concurrent run): what was wanted.
            pass

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(delete, stale))
    return stale


def download_prefix(storage_client, url: str, local_dir: Path, workers: int = 8) -> list[Path]:
    """Download every object under ``url`` into ``local_dir``, keeping relative paths."""
    bucket_name, prefix = split_url(url)
    blobs = [b for b in storage_client.list_blobs(bucket_name, prefix=f"{prefix}/" if prefix else None)
             if not b.name.endswith("/")]

    def download(blob) -> Path:
        target = Path(local_dir) / blob.name[len(prefix):].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))
        return target

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(download, blobs))
