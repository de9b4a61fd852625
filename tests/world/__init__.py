"""The world a product process runs in, faked without touching the product: Google's host names
resolve to local servers (a private hosts file in a mount namespace, or name resolution patched
for in-process tests), those servers present certificates from a test CA that the process trusts
(REQUESTS_CA_BUNDLE, SSL_CERT_FILE, CURL_CA_BUNDLE), and the process holds a throwaway
service-account key. May import tests.fake_compute; nothing in tfcluster imports this.
"""
