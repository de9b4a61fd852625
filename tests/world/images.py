"""Compute Engine images: images.get and images.getFromFamily, served by the Compute stand-in.

From the reference (https://cloud.google.com/compute/docs/reference/rest/v1/images):
- GET /compute/v1/projects/P/global/images/NAME returns the image; an unknown one 404 notFound
  ("The resource 'projects/P/global/images/NAME' was not found").
- GET .../global/images/family/FAMILY "returns the latest image that is part of an image family
  and is not deprecated" (images.getFromFamily); a family with none 404.
- `deprecated.state` is DEPRECATED (still usable, a warning), OBSOLETE (new uses refused) or DELETED
  (https://cloud.google.com/compute/docs/images/image-management-best-practices#deprecating_an_image);
  `deprecated.replacement` names the successor.
- Public images such as deeplearning-platform-release's are readable by every account.
The Deep Learning VM names follow https://cloud.google.com/deep-learning-vm/docs/images
(common-cuXYZ-ubuntu-2204-nvidia-BRANCH-vYYYYMMDD).
"""

from __future__ import annotations

import re

DLVM = "deeplearning-platform-release"


def _image(name: str, family: str, created: str, state: str = "", replacement: str = "") -> dict:
    image = {"kind": "compute#image", "name": name, "family": family, "status": "READY",
             "creationTimestamp": created, "selfLink": f"https://www.googleapis.com/compute/v1/projects/{DLVM}/global/images/{name}"}
    if state:
        image["deprecated"] = {"state": state, "replacement": f"projects/{DLVM}/global/images/{replacement}"}
    return image


def default_images() -> dict:
    """project/name -> image: the families tfcluster's default and its tests name."""
    cu129 = "common-cu129-ubuntu-2204-nvidia-580"
    images = [
        _image(f"{cu129}-v20261001", cu129, "2026-10-01T00:00:00.000-07:00", "DEPRECATED", f"{cu129}-v20261115"),
        _image(f"{cu129}-v20261115", cu129, "2026-11-15T00:00:00.000-07:00"),
        _image("common-cu130-ubuntu-2204-nvidia-590-v20261115", "common-cu130-ubuntu-2204-nvidia-590",
               "2026-11-15T00:00:00.000-07:00"),
        _image("common-cu124-ubuntu-2204-nvidia-550-v20250101", "common-cu124-ubuntu-2204-nvidia-550",
               "2025-01-01T00:00:00.000-07:00", "OBSOLETE", f"{cu129}-v20261115"),
    ]
    return {f"{DLVM}/{image['name']}": image for image in images}


def route(state, method: str, path: str) -> tuple[int, dict] | None:
    match = re.fullmatch(r"/compute/v1/projects/(?P<project>[^/]+)/global/images/(?:family/(?P<family>[^/]+)|(?P<name>[^/]+))",
                         path)
    if match is None or method != "GET":
        return None
    if match["name"]:
        image = state.images.get(f"{match['project']}/{match['name']}")
    else:
        members = [i for key, i in state.images.items() if key.startswith(f"{match['project']}/")
                   and i.get("family") == match["family"] and not i.get("deprecated")]
        image = max(members, key=lambda i: i["creationTimestamp"], default=None)
    if image is None:
        what = f"family/{match['family']}" if match["family"] else match["name"]
        message = f"The resource 'projects/{match['project']}/global/images/{what}' was not found"
        return 404, {"error": {"code": 404, "message": message,
                               "errors": [{"message": message, "domain": "global", "reason": "notFound"}]}}
    return 200, image
