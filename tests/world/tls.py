"""A test CA and a server certificate for Google's host names, made with `cryptography`."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

GOOGLE_NAMES = ("compute.googleapis.com", "oauth2.googleapis.com", "iamcredentials.googleapis.com",
                "www.googleapis.com", "storage.googleapis.com")


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def make_certificates(folder: Path, names=GOOGLE_NAMES) -> tuple[Path, Path, Path]:
    """(ca.pem, cert.pem, key.pem): a CA valid for a day and a leaf for ``names`` signed by it."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, leaf_key = _key(), _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tfcluster test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(leaf_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem(leaf_key))
    return paths


def service_account_key(path: Path, project: str) -> Path:
    """A throwaway service-account key file: google-auth signs its own JWTs with it, and asks
    oauth2.googleapis.com/token (our stand-in) where a flow needs an access token."""
    import json

    key = _key()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": project, "private_key_id": "0" * 40,
        "private_key": key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()).decode(),
        "client_email": f"operator@{project}.iam.gserviceaccount.com", "client_id": "1" * 21,
        "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": "https://oauth2.googleapis.com/token",
    }))
    path.chmod(0o600)
    return path


def operator_key(path: Path) -> dict:
    """{key id: (principal, public key)} of a key file from service_account_key: the operator,
    who owns the project (tests/world/compute_auth.py)."""
    import json

    from tests.world.compute_auth import OPERATOR

    info = json.loads(path.read_text())
    private = serialization.load_pem_private_key(info["private_key"].encode(), password=None)
    return {info["private_key_id"]: (OPERATOR, private.public_key())}
