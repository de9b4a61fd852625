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
    FAKE_STORAGE        gcp-storage-emulator's own URL, holding the cluster bucket (optional)
    FAKE_ARTIFACTS      the fake Artifact Registry's control door, holding the cluster's repository
                        (tests/fake_artifact_registry.py; optional)

Like the google provider, `destroy` refuses a bucket that still holds objects unless
`force_destroy = true` was applied (resource_storage_bucket.go: "Error trying to delete bucket
... containing objects without `force_destroy` set to true"); `-target=ADDR` limits apply to the
named resources; `state rm ADDR` makes destroy leave a resource alone. Also like the provider,
`destroy` deletes the Artifact Registry repository with every image in it: its deletion_policy
defaults to "DELETE" (provider 7.46.1 docs, artifact_registry_repository#deletion_policy) and the
API's repositories.delete "deletes a repository and all of its contents"
(https://cloud.google.com/artifact-registry/docs/reference/rest/v1/projects.locations.repositories/delete).
Creating a repository whose id exists but is not in the state fails as CreateRepository does
(409 ALREADY_EXISTS) until `import ADDR ID` adopts it; `import` of a resource already in the
state fails ("Resource already managed by Terraform"); `state list` without a state fails with
"No state file was found!" as terraform 1.11 does.
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


def storage_bucket(name: str):
    """The cluster bucket in the storage emulator, or None when no emulator is configured."""
    if not os.environ.get("FAKE_STORAGE"):
        return None
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="demo-project", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": os.environ["FAKE_STORAGE"]}).bucket(name)


def bucket_name(variables: dict) -> str:
    return f"{variables['project']}-{variables['cluster_name']}-a1b2c3"


def registry(variables: dict) -> str:
    """terraform/registry.tf's output: LOCATION-docker.pkg.dev/PROJECT/CLUSTER-images."""
    return f"{variables['zone'].rsplit('-', 1)[0]}-docker.pkg.dev/{variables['project']}/{variables['cluster_name']}-images"


REPOSITORY = "google_artifact_registry_repository.images"


def artifacts(action: str, variables: dict) -> bool:
    """Create or delete (with its images) the cluster's repository in the fake Artifact Registry;
    returns whether it existed before."""
    if not os.environ.get("FAKE_ARTIFACTS"):
        return False
    host, project, repository = registry(variables).split("/")
    name = f"projects/{project}/locations/{host.removesuffix('-docker.pkg.dev')}/repositories/{repository}"
    request = urllib.request.Request(f"{os.environ['FAKE_ARTIFACTS']}/_fake/{action}", method="POST",
                                     data=json.dumps({"name": name}).encode())
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())["existed"]


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
    targets = [arg.split("=", 1)[1] for arg in args if arg.startswith("-target=")]
    previous = json.loads(state_file.read_text()) if state_file.exists() else {}
    if action == "state" and args[:1] == ["list"]:
        if not state_file.exists():
            print("No state file was found!\n\nState management commands require a state file.", file=sys.stderr)
            return 1
        print("\n".join(previous.get("managed", [])))
        return 0
    if action == "import":
        address, _ = args[-2:]
        if address in previous.get("managed", []):
            print("╷\n│ Error: Resource already managed by Terraform\n│\n╵", file=sys.stderr)
            return 1
        previous.setdefault("managed", []).append(address)
        state_file.write_text(json.dumps(previous))
        print("Import successful!")
        return 0
    if action == "state" and args[:1] == ["rm"]:
        previous.setdefault("forgotten", []).append(args[-1])
        previous["managed"] = [a for a in previous.get("managed", []) if a != args[-1]]
        state_file.write_text(json.dumps(previous))
        print(f"Removed {args[-1]}\nSuccessfully removed 1 resource instance(s).")
        return 0
    if action == "apply" and targets and all("storage_bucket" in t for t in targets):
        previous["force_destroy"] = bool(variables.get("bucket_force_destroy"))
        state_file.write_text(json.dumps(previous))
        print("Apply complete! Resources: 0 added, 1 changed, 0 destroyed.")
        return 0
    if action == "apply":
        marker = chdir / ".failed-once"
        if os.environ.get("FAKE_TF_FAIL_APPLY") and not marker.exists():
            marker.write_text("x")
            print("╷\n│ Error: Error creating instance: googleapi: Error 403: Quota 'NVIDIA_T4_GPUS' exceeded. "
                  "Limit: 0.0 in region us-west1., quotaExceeded\n│\n╵", file=sys.stderr)
            return 1
        if not targets and REPOSITORY not in previous.get("managed", []):
            if artifacts("repositories", variables):
                print("╷\n│ Error: Error creating Repository: googleapi: Error 409: the repository already exists.\n"
                      f"│\n│   with {REPOSITORY},\n╵", file=sys.stderr)
                return 1
            previous.setdefault("managed", []).append(REPOSITORY)
        hosts = os.environ["FAKE_TF_HOSTS"].split(",")
        keys = os.environ["FAKE_TF_HOSTKEYS"].split(",")
        ready = os.environ.get("FAKE_TF_READY", "").split(",")
        with open(os.environ["FAKE_TF_AUTHORIZED"], "a") as authorized:
            authorized.write(variables["ssh_public_key"] + "\n")
        instances = list(previous.get("instances", []))
        wanted = {int(t.split("[")[1].rstrip("]")) for t in targets if t.startswith("google_compute_instance.")}
        for index in range(variables["workers"]):
            if targets and index not in wanted:
                continue
            name = f"{variables['cluster_name']}-{index}"
            labels = {"tfcluster-cluster": variables["cluster_name"],
                      "tfcluster-role": "chief" if index == 0 else "worker"}
            post("/_fake/instances", {
                "name": name, "zone": variables["zone"], "labels": labels, "internal_ip": hosts[index],
                "external_ip": hosts[index], "max_run_seconds": variables["max_run_hours"] * 3600,
                "termination_action": variables["termination_action"], "spot": variables["spot"],
                "metadata": {"tfcluster-boot-nonce": variables.get("boot_nonce", ""),
                             "tfcluster-idle-minutes": str(variables["idle_minutes"])}})
            post("/_fake/guest", {"name": name, "path": "hostkeys/" + keys[index].split()[0],
                                  "value": keys[index].split()[1]})
            value = ready[index] if index < len(ready) and ready[index] else "ok"
            if value != "none":  # As startup/startup.sh publishes it: "<boot nonce>:<state>".
                post("/_fake/guest", {"name": name, "path": "tfcluster/ready",
                                      "value": f"{variables.get('boot_nonce', '')}:{value}"})
            record = {"name": name, "zone": f"projects/{variables['project']}/zones/{variables['zone']}",
                      "internal_ip": hosts[index], "external_ip": hosts[index]}
            instances = [i for i in instances if i["name"] != name] + [record]
        instances.sort(key=lambda i: int(i["name"].rsplit("-", 1)[1]))
        cluster = variables["cluster_name"]
        post("/_fake/others", {"disks": [i["name"] for i in instances], "firewalls": [
            f"{cluster}-ssh-from-operator", f"{cluster}-tf-between-members"], "subnetworks": [f"{cluster}-subnet"],
            "networks": [f"{cluster}-net"], "addresses": []})
        bucket = storage_bucket(bucket_name(variables))
        if bucket is not None and not bucket.exists():
            bucket.create()
        state_file.write_text(json.dumps({**previous, "instances": instances, "variables": variables,
                                          "force_destroy": bool(variables.get("bucket_force_destroy"))}))
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
            "registry": {"sensitive": False, "type": "string", "value": registry(state["variables"])},
            "labels": {"sensitive": False, "type": ["object", {"tfcluster-cluster": "string"}],
                       "value": {"tfcluster-cluster": name}},
            "service_account": {"sensitive": False, "type": "string",
                                "value": f"{name}-vm@{state['variables']['project']}.iam.gserviceaccount.com"},
        }
        print(json.dumps(outputs, indent=2))
        return 0
    if action == "destroy":
        if state_file.exists():
            state = json.loads(state_file.read_text())
            bucket = storage_bucket(bucket_name(state["variables"]))
            keep_bucket = "google_storage_bucket.cluster" in state.get("forgotten", [])
            if bucket is not None and not keep_bucket and bucket.exists():
                if list(bucket.list_blobs(max_results=1)) and not state.get("force_destroy"):
                    print(f"╷\n│ Error: Error trying to delete bucket {bucket.name} containing objects without "
                          "`force_destroy` set to true\n│\n╵", file=sys.stderr)
                    return 1
                for blob in bucket.list_blobs():
                    blob.delete()
                bucket.delete()
            if REPOSITORY in state.get("managed", []):
                artifacts("delete", state["variables"])
            for instance in state["instances"]:
                if instance["name"] != os.environ.get("FAKE_TF_LEAVE"):
                    post("/_fake/delete", {"name": instance["name"]})
            leave = os.environ.get("FAKE_TF_LEAVE")
            post("/_fake/others", {"disks": [leave] if leave else [], "firewalls": [], "subnetworks": [],
                                   "networks": [], "addresses": []})
            state_file.unlink()
        print("Destroy complete! Resources: 0 destroyed.")
        return 0
    print(f"Error: fake terraform does not know {action!r}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
