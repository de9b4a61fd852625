"""hashicorp/random 3.9.1's random_id, as its source computes it (terraform-provider-random,
internal/provider/resource_id.go: byte_length random bytes; hex, dec, b64_url, b64_std of them;
id is the b64_url form; every argument forces a new resource)."""

from __future__ import annotations

import base64
import secrets

from tests.world.provider.base import Provider, Resource


class RandomId(Resource):
    provider_name = "random"
    type_name = "random_id"
    forces_new = ("byte_length", "keepers", "prefix")

    def create(self, planned: dict) -> dict:
        raw = secrets.token_bytes(int(planned["byte_length"]))
        prefix = planned.get("prefix") or ""
        return {**planned, "id": base64.urlsafe_b64encode(raw).decode().rstrip("="),
                "hex": prefix + raw.hex(), "dec": prefix + str(int.from_bytes(raw, "big")),
                "b64_url": prefix + base64.urlsafe_b64encode(raw).decode().rstrip("="),
                "b64_std": prefix + base64.b64encode(raw).decode()}

    def delete(self, state: dict) -> None:
        pass


class Random(Provider):
    name = "random"
    resources = [RandomId]


def main() -> None:
    from tests.world.provider.servicer import run

    run(Random())
