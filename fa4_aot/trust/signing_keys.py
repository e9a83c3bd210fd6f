"""The Ed25519 keys of signed manifests: a build's key pair (generate, load_private), public key lines and key
ids (parse_public, key_id_of), and the keys a client trusts (trusted_keys, from FA4_AOT_TRUSTED_KEYS).

A public key line is `fa4-aot-ed25519 <base64 of the 32 raw bytes> [name]`; a key id is the first 16 hex
digits of the sha256 of the raw bytes.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TrustError
from ..store.atomic import atomic_write
from ..store.folders import make_dirs

if TYPE_CHECKING:  # cryptography is imported where keys are used: importing it costs a client's cold start
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PUBLIC_PREFIX = "fa4-aot-ed25519"


@dataclass(frozen=True)
class PublicKey:
    key_id: str
    raw: bytes
    name: str = ""

    def line(self) -> str:
        return f"{PUBLIC_PREFIX} {base64.b64encode(self.raw).decode()} {self.name}".rstrip()


def key_id_of(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:16]


def generate(folder: Path, name: str) -> tuple[Path, PublicKey]:
    """A new key pair: `<folder>/<name>.key` (PKCS#8 PEM, mode 0600) and `<name>.pub` (one line). Refuses to
    overwrite an existing private key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private_path = folder / f"{name}.key"
    if private_path.exists():
        raise TrustError(f"{private_path} exists; pick another --name or move it away first")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    make_dirs(folder, 0o700)  # owner-only whatever the umask: it holds the private key
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = public_of(key, name)
    atomic_write(folder / f"{name}.pub", (public.line() + "\n").encode())
    return private_path, public


def public_of(key: Ed25519PrivateKey, name: str) -> PublicKey:
    """The public half of `key`, named `name`."""
    from cryptography.hazmat.primitives import serialization

    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PublicKey(key_id_of(raw), raw, name)


def load_private(path: Path) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise TrustError(f"cannot read signing key {path}: {e}; make one with `fa4-aot keys generate`") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise TrustError(f"{path} is not an Ed25519 key; make one with `fa4-aot keys generate`")
    return key


def parse_public(line: str) -> PublicKey:
    """One `fa4-aot-ed25519 <base64> [name]` line. Raises TrustError for anything else."""
    parts = line.split(maxsplit=2)
    try:
        if len(parts) < 2 or parts[0] != PUBLIC_PREFIX:
            raise ValueError(f"expected '{PUBLIC_PREFIX} <base64> [name]'")
        raw = base64.b64decode(parts[1], validate=True)
        if len(raw) != 32:
            raise ValueError("an Ed25519 public key is 32 bytes")
    except ValueError as e:
        raise TrustError(f"invalid public key {line[:80]!r}: {e}") from e
    return PublicKey(key_id_of(raw), raw, parts[2] if len(parts) > 2 else "")


def trusted_keys(spec: str | None) -> dict[str, PublicKey]:
    """Keys from FA4_AOT_TRUSTED_KEYS: a file of key lines, or the lines themselves (separated by newlines or
    ';'). Blank lines and '#' comments are skipped. Unset or empty: no keys (trust is off). Set to anything
    that yields no key (an empty or comment-only file, blanks) or names a file that cannot be read: TrustError,
    never trust silently off."""
    if not spec:
        return {}
    source = "FA4_AOT_TRUSTED_KEYS"
    if spec.lstrip().startswith(PUBLIC_PREFIX) or not spec.strip():
        text = spec
    else:
        source = f"FA4_AOT_TRUSTED_KEYS file {spec}"
        try:
            text = Path(spec).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise TrustError(f"cannot read {source}: {e}; point it at the build's .pub file (`fa4-aot keys "
                             "generate`) or give the key line itself") from None
    lines = [x.strip() for chunk in text.splitlines() for x in chunk.split(";")]
    keys = [parse_public(x) for x in lines if x and not x.startswith("#")]
    if not keys:
        raise TrustError(f"{source} is set but holds no key, which would turn signature checks off: put the "
                         f"build's public key line ('{PUBLIC_PREFIX} <base64> [name]') there, or unset it")
    return {k.key_id: k for k in keys}
