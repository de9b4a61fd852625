#!/usr/bin/python3
"""The OS Login guest environment's part, played on a booted VM (tests/world/booted.py mounts this
file read-only; GoogleCloudPlatform/guest-oslogin is the real one):

- `keys USER` is sshd's AuthorizedKeysCommand (src/authorized_keys/authorized_keys.cc): with OS
  Login on for the instance (enable-oslogin, the instance's value else the project's), it asks the
  metadata server oslogin/users?username=USER for the login profile, then
  oslogin/authorize?email=E&policy=login, and prints the profile's keys that have not expired
  (oslogin_utils.cc AuthorizeUser, ParseJsonToSshKeys). With OS Login off it prints the keys the
  guest agent wrote from ssh-keys (~USER/.ssh/authorized_keys), and no profile key. So with OS
  Login on a metadata key no longer logs in ("OS Login ... disables metadata-based SSH key
  configuration", https://cloud.google.com/compute/docs/oslogin), and with it off a profile key
  does not.
- `sync` plays the NSS module (src/nss): the profiles' POSIX accounts exist on the machine while
  OS Login is on (here made with useradd from oslogin/users?pagesize=, polled every second).
"""

import json
import os
import pwd
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

MD = "http://metadata.google.internal/computeMetadata/v1/"


def get(path):
    request = urllib.request.Request(MD + path, headers={"Metadata-Flavor": "Google"})
    try:
        return urllib.request.urlopen(request, timeout=5).read().decode()
    except (urllib.error.URLError, OSError):
        return None


def enabled():
    value = get("instance/attributes/enable-oslogin")
    if value is None:
        value = get("project/attributes/enable-oslogin") or ""
    return value.strip().upper() == "TRUE"


def keys(user):
    if not enabled():
        try:
            home = pwd.getpwnam(user).pw_dir
            with open(os.path.join(home, ".ssh", "authorized_keys")) as handle:
                sys.stdout.write(handle.read())
        except (KeyError, OSError):
            pass
        return
    answer = get("oslogin/users?username=" + urllib.parse.quote(user))
    if not answer:
        return
    profile = json.loads(answer)["loginProfiles"][0]
    email = profile.get("name", "")
    authorized = get("oslogin/authorize?" + urllib.parse.urlencode({"email": email, "policy": "login"}))
    if not authorized or not json.loads(authorized).get("success"):
        print(f"OS Login user {user} does not have login permission.", file=sys.stderr)
        return
    now = int(time.time() * 1_000_000)
    for key in (profile.get("sshPublicKeys") or {}).values():
        expires = int(key.get("expirationTimeUsec") or 0)
        if key.get("key") and (not expires or expires > now):
            print(key["key"])


def sync():
    while True:
        answer = get("oslogin/users?pagesize=1000") if enabled() else None
        for profile in (json.loads(answer).get("loginProfiles", []) if answer else []):
            for account in profile.get("posixAccounts") or []:
                name = account.get("username", "")
                try:
                    pwd.getpwnam(name)
                except KeyError:
                    subprocess.run(["useradd", "-m", "-u", str(account["uid"]), "-s", "/bin/bash", name],
                                   capture_output=True)
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["keys"] and len(sys.argv) == 3:
        keys(sys.argv[2])
    elif sys.argv[1:] == ["sync"]:
        sync()
