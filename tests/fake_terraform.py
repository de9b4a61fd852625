"""A fake `terraform` for the gcp backend's tests: same command line, real-shaped output.

`apply` "creates" the VMs in the fake Compute API (tests/fake_compute.py) and boots them:
each VM gets the address of a real sshd test host, the cluster's public key is added to
that host's authorized keys (as the metadata ssh-keys entry would), and the guest agent's
attributes appear (hostkeys/ssh-ed25519, tfcluster/ready). Environment:

    FAKE_COMPUTE        the fake Compute API's base URL
    FAKE_TF_HOSTS       comma-separated addresses, one per VM
    FAKE_TF_HOSTKEYS    comma-separated "ssh-ed25519 AAAA..." host keys, one per VM
    FAKE_TF_AUTHORIZED  the test hosts' authorized_keys file
    FAKE_TF_READY       readiness value per VM, comma-separated (default "ok" for all)
    FAKE_TF_FAIL_APPLY  if set, `apply` fails once with a real-looking error
    FAKE_TF_LEAVE       a VM name that `destroy` fails to remove
    FAKE_TF_LOG         file that records every invocation
"""

import json
import os
import sys
import urllib.request
from pathlib import Path


def post(path: str, body: dict) -> None:
    request = urllib.request.Request(os.environ["FAKE_COMPUTE"] + path, data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=5).close()


def main(argv: list[str]) -> int:
    chdir = Path(argv[0].split("=", 1)[1])
    action, args = argv[1], argv[2:]
    with open(os.environ["FAKE_TF_LOG"], "a") as log:
        log.write(json.dumps([action, *args]) + "\n")
    state_file = chdir / "fake.tfstate.json"
    if action == "init":
        if not (chdir / "versions.tf").exists():
            print("Error: No configuration files", file=sys.stderr)
            return 1
        print("Terraform has been successfully initialized!")
        return 0
    variables = json.loads((chdir / "terraform.tfvars.json").read_text())
    if action == "apply":
        marker = chdir / ".failed-once"
        if os.environ.get("FAKE_TF_FAIL_APPLY") and not marker.exists():
            marker.write_text("x")
            print("╷\n│ Error: Error creating instance: googleapi: Error 403: Quota 'NVIDIA_T4_GPUS' exceeded. "
                  "Limit: 0.0 in region us-west1., quotaExceeded\n│\n╵", file=sys.stderr)
            return 1
        hosts = os.environ["FAKE_TF_HOSTS"].split(",")
        keys = os.environ["FAKE_TF_HOSTKEYS"].split(",")
        ready = os.environ.get("FAKE_TF_READY", "").split(",")
        with open(os.environ["FAKE_TF_AUTHORIZED"], "a") as authorized:
            authorized.write(variables["ssh_public_key"] + "\n")
        instances = []
        for index in range(variables["workers"]):
            name = f"{variables['cluster_name']}-{index}"
            labels = {"tfcluster-cluster": variables["cluster_name"],
                      "tfcluster-role": "chief" if index == 0 else "worker"}
            post("/_fake/instances", {"name": name, "zone": variables["zone"], "labels": labels})
            post("/_fake/guest", {"name": name, "path": "hostkeys/" + keys[index].split()[0],
                                  "value": keys[index].split()[1]})
            value = ready[index] if index < len(ready) and ready[index] else "ok"
            if value != "none":  # As startup/startup.sh publishes it: "<boot nonce>:<state>".
                post("/_fake/guest", {"name": name, "path": "tfcluster/ready",
                                      "value": f"{variables.get('boot_nonce', '')}:{value}"})
            instances.append({"name": name, "zone": f"projects/{variables['project']}/zones/{variables['zone']}",
                              "internal_ip": hosts[index], "external_ip": hosts[index]})
        state_file.write_text(json.dumps({"instances": instances, "variables": variables}))
        print(f"Apply complete! Resources: {9 + 2 * len(instances)} added, 0 changed, 0 destroyed.")
        return 0
    if action == "output":
        if not state_file.exists():
            print("{}")
            return 0
        state = json.loads(state_file.read_text())
        name = state["variables"]["cluster_name"]
        outputs = {
            "bucket": {"sensitive": False, "type": "string", "value": f"{state['variables']['project']}-{name}-a1b2c3"},
            "instances": {"sensitive": False, "type": ["tuple", [["object", {"external_ip": "string",
                          "internal_ip": "string", "name": "string", "zone": "string"}]] * len(state["instances"])],
                          "value": state["instances"]},
            "labels": {"sensitive": False, "type": ["object", {"tfcluster-cluster": "string"}],
                       "value": {"tfcluster-cluster": name}},
            "service_account": {"sensitive": False, "type": "string",
                                "value": f"{name}-vm@{state['variables']['project']}.iam.gserviceaccount.com"},
        }
        print(json.dumps(outputs, indent=2))
        return 0
    if action == "destroy":
        if state_file.exists():
            for instance in json.loads(state_file.read_text())["instances"]:
                if instance["name"] != os.environ.get("FAKE_TF_LEAVE"):
                    post("/_fake/delete", {"name": instance["name"]})
            state_file.unlink()
        print("Destroy complete! Resources: 0 destroyed.")
        return 0
    print(f"Error: fake terraform does not know {action!r}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
