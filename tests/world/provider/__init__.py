"""Python stand-ins for the hashicorp/google 7.46.1 and hashicorp/random 3.9.1 Terraform providers.

The real terraform binary installs them from a filesystem mirror (mirror.py) and speaks plugin
protocol 6 to them through the `tf` package (PyPI, 1.2.0). Their schemas are generated from the
committed provider JSON (tests/provider_schema/*.json, schema.py); their create/read/update/delete
call the Google stand-ins of the test world through Google's own host names, with the
credentials the provider would use (GOOGLE_APPLICATION_CREDENTIALS). May import tests.world and
tests.provider_schema; nothing in tfcluster imports this.
"""
