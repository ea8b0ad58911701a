"""Check the hub's signature on an engine before anything deserialises it.

An engine is executable: loading a crafted one can run code. The hub signs
each engine's sha256 (the hex string) with Ed25519 and gives devices the
public key in `GET device`; a worker loads an engine only when the file
matches that sha256 and the signature verifies.
"""

from workers.errors import JobError


class TamperedEngine(JobError):
    """The engine's signature is not the hub's: the file must not be loaded."""


def verify(sha256_hex, signature_hex, public_key_hex):
    """Return when signature_hex is the hub's Ed25519 signature of sha256_hex; else raise."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex))
        key.verify(bytes.fromhex(signature_hex), sha256_hex.encode())
    except (InvalidSignature, ValueError, TypeError) as error:
        raise TamperedEngine(
            "the engine's signature does not verify: refusing to load it"
        ) from error
