"""Which machine plays a VM that instances.insert creates: a real sshd host of a HostLab.

What Compute Engine and the guest do for a new VM, done to the host that plays it: the VM gets
its addresses (here the host's, internal and external alike); the guest environment adds the
metadata `ssh-keys` entry's key to the login's authorized keys
(https://cloud.google.com/compute/docs/connect/add-ssh-keys#metadata); the guest agent publishes
the host keys as guest attributes hostkeys/<type>
(https://cloud.google.com/compute/docs/instances/connecting-advanced#verify-host-key); the boot
script (startup/startup.sh) reports "<boot nonce>:<state>" at tfcluster/ready. Guest attributes
are written only when the metadata sets enable-guest-attributes=TRUE
(https://cloud.google.com/compute/docs/metadata/manage-guest-attributes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tests.fake_metadata import FakeMetadataServer
from tests.hostlab import SUBNET, VM_LOGIN, HostLab


@dataclass
class LabMachines:
    lab: HostLab
    # The boot script's report per VM name ("ok" when absent; "none" publishes nothing).
    ready: dict = field(default_factory=dict)
    # The host key line the guest agent publishes per VM name (default: the host's own).
    published_keys: dict = field(default_factory=dict)

    def __post_init__(self):
        # The metadata server the VMs reach as metadata.google.internal (the lab's /etc/hosts),
        # with their service account's token (tests/world/names.py VM_TOKEN): what `docker login`
        # on a VM signs in with. One for the lab: every VM here has the same service account.
        from tests.world.names import VM_TOKEN

        if self.lab.vm_login:
            self.metadata = FakeMetadataServer({"instance/service-accounts/default/token": json.dumps(
                {"access_token": VM_TOKEN, "expires_in": 3599, "token_type": "Bearer"})}, bind=(f"{SUBNET}.1", 80))
            self.lab.closers.append(self.metadata.close)

    def host_for(self, name: str):
        return self.lab.hosts[int(name.rsplit("-", 1)[1]) % len(self.lab.hosts)]

    def __call__(self, name: str, record: dict) -> None:
        """FakeCompute.on_insert: give the new VM its machine, and boot it."""
        host = self.host_for(name)
        record["internal_ip"] = record["external_ip"] = host.address
        metadata = record.get("metadata", {})
        user_key = metadata.get("ssh-keys", "").split(":", 1)
        if len(user_key) == 2:
            # Into the named login's own authorized keys (labs with the VMs' login), else the
            # file every login of the lab reads.
            own = self.lab.vm_login and user_key[0] == VM_LOGIN
            path = self.lab.home(host.index) / ".ssh" / "authorized_keys" if own else self.lab.authorized_keys
            with open(path, "a") as authorized:
                authorized.write(user_key[1].strip() + "\n")
        if str(metadata.get("enable-guest-attributes", "")).upper() != "TRUE":
            return
        key_type, key = self.published_keys.get(name, host.host_key_public).split()[:2]
        record["guest"][f"hostkeys/{key_type}"] = key
        value = self.ready.get(name, "ok")
        if value != "none":
            record["guest"]["tfcluster/ready"] = f"{metadata.get('tfcluster-boot-nonce', '')}:{value}"
