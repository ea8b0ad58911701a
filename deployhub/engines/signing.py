"""The hub's engine signature: Ed25519 over an engine's sha256, verifiable on every device.

The key is derived from SECRET_KEY (HKDF), so there is no second secret to keep;
devices get the public half from `GET /api/v1/device`. A keyed MAC would need
the secret on every device, and then any device could sign.
"""

from functools import cache

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.conf import settings


@cache
def _private_key(secret):
    seed = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"deployhub", info=b"engine signing key"
    ).derive(secret.encode())
    return Ed25519PrivateKey.from_private_bytes(seed)


def private_key():
    return _private_key(settings.SECRET_KEY)


def public_key_hex():
    """Return the raw public key, hex encoded, as devices receive it."""
    raw = private_key().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return raw.hex()


def sign(sha256_hex):
    """Return the hex signature of an engine's sha256 (hex string)."""
    return private_key().sign(sha256_hex.encode()).hex()


def verify(sha256_hex, signature_hex):
    """Return True when the signature is the hub's signature of this sha256."""
    from cryptography.exceptions import InvalidSignature

    try:
        private_key().public_key().verify(bytes.fromhex(signature_hex), sha256_hex.encode())
    except (InvalidSignature, ValueError):
        return False
    return True
