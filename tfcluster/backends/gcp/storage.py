"""Cloud Storage transfers with google-cloud-storage, in parallel.

The laptop side uses google-cloud-storage with the operator's credentials; the VMs use
TensorFlow's own gs:// client with theirs.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
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

    from tfcluster.backends.gcp.compute import default_credentials

    return storage.Client(project=project, credentials=default_credentials())


def upload_dir(storage_client, local_dir: Path, url: str, workers: int = 8) -> list[str]:
    """Upload every file under ``local_dir`` to ``url``; the manifest goes last, so a reader
    that sees it sees a complete set. Returns the object names."""
    bucket_name, prefix = split_url(url)
    bucket = storage_client.bucket(bucket_name)
    files = sorted(p for p in Path(local_dir).rglob("*") if p.is_file())
    last = [p for p in files if p.name == MANIFEST]
    first = [p for p in files if p.name != MANIFEST]

    def upload(path: Path) -> str:
        name = f"{prefix}/{path.relative_to(local_dir).as_posix()}".lstrip("/")
        bucket.blob(name).upload_from_filename(str(path))
        return name

    with ThreadPoolExecutor(max_workers=workers) as pool:
        names = list(pool.map(upload, first))
    return names + [upload(path) for path in last]


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
