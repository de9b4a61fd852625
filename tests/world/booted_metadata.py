"""The metadata server of the booted world (tests/world/booted.py): one server, answering each
machine by its address from its instance's record in the Compute stand-in, as Google's answers
each VM (https://cloud.google.com/compute/docs/metadata/overview). Protocol checks (the
Metadata-Flavor header, no X-Forwarded-For) are tests/fake_metadata.py's.

What it serves, from https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys:
- instance/attributes/KEY: the instance's metadata as Compute holds it now (terraform's at
  creation, then every setMetadata): the startup-script terraform read from startup/startup.sh,
  ssh-keys, the nonce, the idle settings;
- instance/id (a number fixed at creation), name, hostname, zone, project/project-id and
  numeric-project-id, network-interfaces/0/ip and access-configs/0/external-ip;
- instance/maintenance-event ("NONE", or the record's "maintenance_event") and instance/preempted
  ("FALSE"/"TRUE");
- instance/service-accounts/default/email and /token: the instance's own service account
  (serviceAccounts[0].email, as Compute stores it) and that account's access token
  (compute_auth.token_for: each VM its own identity;
  https://cloud.google.com/compute/docs/access/authenticate-workloads#applications); an instance
  without a service account has no such path (404);
- instance/guest-attributes/NS/KEY: read and written in the record's guest attributes, which
  getGuestAttributes serves to the operator;
- oslogin/users?username=U, oslogin/users?pagesize=N and oslogin/authorize?email=E&policy=P: the
  OS Login guest environment's questions, answered from the world's OS Login (tests/world/oslogin.py).
"""

from __future__ import annotations

import time

from tests.fake_metadata import GUEST, FakeMetadataServer, GuestWrite, token_answer
from urllib.parse import parse_qs

from tests.world.compute_auth import account_of, token_for
from tests.world.oslogin import guest_answer


class InstanceMetadata(FakeMetadataServer):
    def __init__(self, state, name_at, bind: tuple[str, int], oslogin=None):
        # The Compute stand-in's state; name_at(address) -> instance name or None.
        self.state, self.name_at = state, name_at
        # The world's OS Login (tests/world/oslogin.py), for the oslogin/ paths.
        self.oslogin = oslogin
        # Every guest-attribute write, as (instance name, GuestWrite), in arrival order.
        self.named_writes: list[tuple[str, GuestWrite]] = []
        super().__init__({}, bind=bind)

    def _fixed(self, name: str, record: dict) -> dict[str, str]:
        interface = (record.get("body", {}).get("networkInterfaces") or [{}])[0]
        values = {
            "instance/id": record.get("id", ""), "instance/name": name,
            "instance/hostname": f"{name}.{record['zone']}.c.{self.state.project}.internal",
            "instance/zone": f"projects/123456789012/zones/{record['zone']}",
            "project/project-id": self.state.project, "project/numeric-project-id": "123456789012",
            "instance/network-interfaces/0/ip": record.get("internal_ip") or "",
            "instance/maintenance-event": record.get("maintenance_event", "NONE"),
            "instance/preempted": "TRUE" if record.get("preempted") else "FALSE",
        }
        if record.get("external_ip") and interface.get("accessConfigs"):
            values["instance/network-interfaces/0/access-configs/0/external-ip"] = record["external_ip"]
        email = account_of(record)
        if email:
            values["instance/service-accounts/default/email"] = email
            values["instance/service-accounts/default/token"] = token_answer(token_for(email))
        return values

    def read(self, client: str, path: str) -> str | None:
        name = self.name_at(client)
        with self.state.lock:
            record = self.state.instances.get(name) if name else None
            if record is None:
                return None
            if path.startswith(GUEST):
                return record["guest"].get(path.removeprefix(GUEST))
            if path.startswith("instance/attributes/"):
                return record.get("metadata", {}).get(path.removeprefix("instance/attributes/"))
            if path.startswith("project/attributes/"):
                return self.state.project_metadata.get(path.removeprefix("project/attributes/"))
            if path.startswith("oslogin/") and self.oslogin is not None:
                route, _, query = path.partition("?")
                return guest_answer(self.oslogin, self.state, record, route,
                                    {k: v[0] for k, v in parse_qs(query).items()})
            return self._fixed(name, record).get(path)

    def write(self, client: str, key: str, value: str) -> bool:
        name = self.name_at(client)
        with self.state.lock:
            record = self.state.instances.get(name) if name else None
            if record is None:
                return False
            record["guest"][key] = value
            self.named_writes.append((name, GuestWrite(time.monotonic(), key, value)))
        return True

    def history(self, name: str, key: str) -> list[str]:
        """Every value instance ``name`` wrote to one guest attribute, oldest first."""
        with self.state.lock:
            return [write.value for who, write in self.named_writes if who == name and write.key == key]
