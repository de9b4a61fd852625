"""Cloud Storage permissions as Google documents them, and the grants terraform/ gives the VMs.

ROLE_PERMISSIONS is transcribed from the IAM role reference
(https://cloud.google.com/iam/docs/roles-permissions/storage and
https://cloud.google.com/storage/docs/access-control/iam-roles), storage permissions only.
REQUEST_PERMISSIONS follows the Cloud Storage JSON API reference, where each method's page names
the permission it needs (https://cloud.google.com/storage/docs/json_api/v1/buckets/get:
storage.buckets.get; objects/list: storage.objects.list; objects/get: storage.objects.get;
objects/insert: storage.objects.create (and storage.objects.delete to overwrite);
objects/delete: storage.objects.delete; objects/patch: storage.objects.update;
objects/rewrite and objects/copy: storage.objects.create on the destination and
storage.objects.get on the source; objects/compose: storage.objects.create). TensorFlow reads
object bytes through the XML API's path-style GET on storage.googleapis.com/<bucket>/<object>,
which needs storage.objects.get (https://cloud.google.com/storage/docs/xml-api/get-object-download).
"""

from __future__ import annotations

import re
from pathlib import Path

ROLE_PERMISSIONS = {
    # "Grants full control over objects, including listing, creating, viewing, and deleting
    # objects" -- but not buckets.get.
    "roles/storage.objectAdmin": {
        "storage.objects.create", "storage.objects.delete", "storage.objects.get", "storage.objects.list",
        "storage.objects.update", "storage.objects.getIamPolicy", "storage.objects.setIamPolicy",
        "storage.objects.restore", "storage.managedFolders.create", "storage.managedFolders.delete",
        "storage.managedFolders.get", "storage.managedFolders.list", "storage.multipartUploads.abort",
        "storage.multipartUploads.create", "storage.multipartUploads.list",
        "storage.multipartUploads.listParts"},
    "roles/storage.objectViewer": {
        "storage.objects.get", "storage.objects.list", "storage.managedFolders.get", "storage.managedFolders.list"},
    "roles/storage.objectCreator": {
        "storage.objects.create", "storage.managedFolders.create", "storage.multipartUploads.abort",
        "storage.multipartUploads.create", "storage.multipartUploads.list", "storage.multipartUploads.listParts"},
    # "Grants permission to list a bucket's contents and read bucket metadata, excluding IAM
    # policies."
    "roles/storage.legacyBucketReader": {"storage.buckets.get", "storage.objects.list"},
    "roles/storage.legacyBucketWriter": {
        "storage.buckets.get", "storage.objects.create", "storage.objects.delete", "storage.objects.list",
        "storage.multipartUploads.abort", "storage.multipartUploads.create", "storage.multipartUploads.list",
        "storage.multipartUploads.listParts"},
}

# (method, path pattern) -> permissions the request needs. Paths as the JSON API has them,
# with or without the /upload or /download prefix.
REQUEST_PERMISSIONS = [
    ("GET", r"/storage/v1/b/[^/]+", {"storage.buckets.get"}),
    ("GET", r"/storage/v1/b/[^/]+/o", {"storage.objects.list"}),
    ("GET", r"/(?:download/)?storage/v1/b/[^/]+/o/.+", {"storage.objects.get"}),
    ("POST", r"/upload/storage/v1/b/[^/]+/o", {"storage.objects.create"}),
    ("PUT", r"/upload/storage/v1/b/[^/]+/o", {"storage.objects.create"}),
    ("POST", r"/storage/v1/b/[^/]+/o", {"storage.objects.create"}),
    ("DELETE", r"/storage/v1/b/[^/]+/o/.+", {"storage.objects.delete"}),
    ("PATCH", r"/storage/v1/b/[^/]+/o/.+", {"storage.objects.update"}),
    ("PUT", r"/storage/v1/b/[^/]+/o/.+", {"storage.objects.update"}),
    ("POST", r"/storage/v1/b/[^/]+/o/.+/(?:rewriteTo|copyTo)/b/[^/]+/o/.+", {"storage.objects.create",
                                                                         "storage.objects.get"}),
    ("POST", r"/storage/v1/b/[^/]+/o/.+/compose", {"storage.objects.create"}),
    ("GET", r"/(?!storage/|upload/|download/)[^/]+/.+", {"storage.objects.get"}),
    ("HEAD", r"/(?!storage/|upload/|download/)[^/]+/.+", {"storage.objects.get"}),
]


def needed(method: str, path: str) -> set[str] | None:
    """The permissions a JSON API request needs; None for a request this table does not know."""
    for verb, pattern, permissions in REQUEST_PERMISSIONS:
        if verb == method and re.fullmatch(pattern, path):
            return permissions
    return None


def vm_bucket_roles(terraform_dir: Path) -> list[str]:
    """The roles terraform/ grants every VM's service account on the cluster bucket."""
    import hcl2
    from hcl2 import SerializationOptions

    options = SerializationOptions(strip_string_quotes=True, explicit_blocks=False)
    roles = []
    for path in sorted(terraform_dir.glob("*.tf")):
        with open(path) as handle:
            parsed = hcl2.load(handle, serialization_options=options)
        for block in parsed.get("resource", []):
            for name, body in block.get("google_storage_bucket_iam_member", {}).items():
                member = str(body.get("member", ""))
                if re.search(r"google_service_account\.vm\[count\.index\]\.email", member):
                    roles.append(str(body["role"]))
    return roles


def permissions_of(roles: list[str]) -> set[str]:
    return set().union(*(ROLE_PERMISSIONS[role] for role in roles)) if roles else set()
