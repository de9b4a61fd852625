"""What a Vertex AI job's replicas fetch from the cluster's bucket: the code, tfcluster's worker
support, and the data.

The code and the support are the same content-hashed bundles the ssh backend ships
(tfcluster/backends/ssh/sync.py), one object each, gs://BUCKET/code/<digest>.tar.gz: an object
that is there already is not uploaded again (created with ifGenerationMatch=0, so two launchers
never overwrite each other). Local TFRecords (`data_dir`, or the synthetic set) go to
gs://BUCKET/data/<digest>/ with the gcp backend's resumable upload_dir; data already in a bucket
(`invoke data`, a gs:// data_dir) is read where it is. A `train --requirements` file is a third object,
gs://BUCKET/requirements/<digest>.txt, the job's bootstrap installs (jobspec.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tfcluster.backends.base import Payload, Staged
from tfcluster.backends.gcp.cloud import storage as gcs
from tfcluster.backends.gcp.cloud import translated
from tfcluster.backends.ssh.sync import collect_files, make_bundle


# The environment key that carries the bundles' gs:// URLs to the job's command (and, through the run's
# launch file, to a `train --resume` in another shell); the replicas see it too, which tells them nothing secret.
BUNDLES = "TFCLUSTER_BUNDLES"


def _put(bucket, name: str, payload: bytes, content_type: str = "application/gzip") -> bool:
    """Upload ``payload`` as ``name`` unless it exists; whether it was uploaded."""
    from google.api_core import exceptions

    blob = bucket.blob(name)
    if blob.exists():
        return False
    try:
        blob.upload_from_string(payload, content_type=content_type, if_generation_match=0)
    except exceptions.PreconditionFailed:
        return False  # Another launcher put the same content there meanwhile.
    return True


def stage(project: str, bucket_name: str, payload: Payload, project_root: Path) -> Staged:
    """Upload what the run needs; the argv and environment every replica runs with. ``uploaded`` has
    one entry, the bucket: whether anything had to be uploaded."""
    if payload.script is None:
        code = make_bundle("code", project_root, collect_files(project_root / "trainer"))
        argv = [payload.python, "-u", "-m", "trainer.task"]
    elif payload.project is not None:
        code = make_bundle("code", payload.project)
        argv = [payload.python, "-u", payload.script.relative_to(payload.project).as_posix()]
    else:
        code = make_bundle("code", payload.script.parent, [payload.script])
        argv = [payload.python, "-u", payload.script.name]
    support = make_bundle("worker", project_root, [project_root / "tfcluster" / "__init__.py",
                                                    project_root / "tfcluster" / "workerpath" / "sitecustomize.py"])
    env = {}
    with translated(project, f"uploading the run's code and data to gs://{bucket_name}"):
        client = gcs.client(project)
        bucket = client.bucket(bucket_name)
        uploaded = [_put(bucket, f"{b.kind}/{b.digest}.tar.gz", b.payload) for b in (code, support)]
        if payload.data_dir is not None:
            data = make_bundle("data", payload.data_dir)
            url = f"gs://{bucket_name}/data/{data.digest}"
            uploaded.append(bool(gcs.upload_dir(client, payload.data_dir, url).uploaded))
            env["TFCLUSTER_DATA_DIR"] = url
        names = [f"{b.kind}/{b.digest}.tar.gz" for b in (code, support)]
        if payload.requirements is not None:  # train --requirements: the bootstrap pip-installs it.
            names.append(f"requirements/{hashlib.sha256(payload.requirements).hexdigest()[:16]}.txt")
            uploaded.append(_put(bucket, names[-1], payload.requirements, "text/plain"))
    env[BUNDLES] = " ".join(f"gs://{bucket_name}/{name}" for name in names)
    return Staged(argv=argv + list(payload.args), env=env, uploaded={f"gs://{bucket_name}": any(uploaded)})
