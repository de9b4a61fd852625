"""What each resource stand-in sends Google to create a resource, for tests that run without `tf`.

`python -m tests.world.provider.create_calls` (in the providers' own interpreter, mirror.provider_python)
reads {"provider": {the google provider block's settings}, "cases": [{"type", "planned"}, ...]}
on stdin and prints, per case, [method, URL, body] of its create call (Resource.create_request,
after the resource's own create plan), or {"error": "..."} where the stand-in refuses it.
"""

from __future__ import annotations

import json
import sys


def create_calls(provider_config: dict, cases: list[dict]) -> list:
    from tests.world.provider.google_provider import Google
    from tests.world.provider.instance_body import Unexpanded
    from tests.world.provider.servicer import ProviderFailure

    google = Google()
    google.configure_provider(None, provider_config)
    classes = {klass.type_name: klass for klass in google.get_resources()}
    out = []
    for case in cases:
        resource = classes[case["type"]](google)
        try:
            out.append(list(resource.create_request(resource.plan_create(case["planned"]))))
        except (ProviderFailure, Unexpanded, KeyError, TypeError, ValueError) as error:
            out.append({"error": f"{type(error).__name__}: {error}"})
    return out


def main() -> None:
    given = json.load(sys.stdin)
    print(json.dumps(create_calls(given["provider"], given["cases"])))


if __name__ == "__main__":
    main()
