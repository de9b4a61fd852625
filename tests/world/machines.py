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

from dataclasses import dataclass, field

from tests.fake_metadata import FakeMetadataServer, token_answer
from tests.hostlab import SUBNET, VM_LOGIN, HostLab
from tests.world.compute_auth import account_of, token_for

ACCOUNT_PATHS = ("instance/service-accounts/default/email", "instance/service-accounts/default/token")


class AccountMetadata(FakeMetadataServer):
    """A metadata server whose service-account paths answer, for the machine at the client's
    address, from its instance as Compute holds it: instance/service-accounts/default/email is the
    account it runs as, /token that account's access token (token_for); an instance without a
    service account has neither (404)
    (https://cloud.google.com/compute/docs/access/authenticate-workloads#applications).
    ``instance_at(client address)`` -> the instance's Compute record, or None."""

    def __init__(self, values: dict[str, str], instance_at, bind: tuple[str, int]):
        self.instance_at = instance_at
        super().__init__(values, bind=bind)

    def read(self, client: str, path: str) -> str | None:
        if path not in ACCOUNT_PATHS:
            return super().read(client, path)
        email = account_of(self.instance_at(client))
        if email is None:
            return None
        return email if path.endswith("/email") else token_answer(token_for(email))


@dataclass
class LabMachines:
    lab: HostLab
    # The boot script's report per VM name ("ok" when absent; "none" publishes nothing).
    ready: dict = field(default_factory=dict)
    # The host key line the guest agent publishes per VM name (default: the host's own).
    published_keys: dict = field(default_factory=dict)

    def __post_init__(self):
        # The metadata server the VMs reach as metadata.google.internal (the lab's /etc/hosts):
        # one for the lab, answering each host as the instance it last played, with that
        # instance's own service account and its token: what `docker login` on a VM signs in with.
        # Address of a host -> the Compute record of the instance it plays.
        self.playing: dict[str, dict] = {}
        if self.lab.vm_login:
            self.metadata = AccountMetadata({}, self.playing.get, bind=(f"{SUBNET}.1", 80))
            self.lab.closers.append(self.metadata.close)

    def host_for(self, name: str):
        return self.lab.hosts[int(name.rsplit("-", 1)[1]) % len(self.lab.hosts)]

    def __call__(self, name: str, record: dict) -> None:
        """FakeCompute.on_insert: give the new VM its machine, and boot it."""
        host = self.host_for(name)
        record["internal_ip"] = record["external_ip"] = host.address
        self.playing[host.address] = record
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
