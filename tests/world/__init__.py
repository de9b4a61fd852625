"""The world a product process runs in, faked without touching the product: Google's host names
resolve to local servers (a private hosts file in a mount namespace, or name resolution patched
for in-process tests), those servers present certificates from a test CA that the process trusts
(REQUESTS_CA_BUNDLE, SSL_CERT_FILE, CURL_CA_BUNDLE), and the process holds a throwaway
service-account key. booted*.py turn the instances Compute creates into machines that boot
(tests/vmlab.py's image). May import tests.fake_compute, tests.fake_metadata, tests.vmlab and
tests.hostlab; nothing in tfcluster imports this.
"""
