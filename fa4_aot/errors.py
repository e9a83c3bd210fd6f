"""Every error fa4-aot raises on purpose: one root, a few kinds, each message naming what failed and the fix."""

from __future__ import annotations


class Fa4AotError(Exception):
    """Root of fa4-aot's errors. The CLI prints these as one line, without a traceback."""


class ConfigError(Fa4AotError, ValueError):
    """variants.toml (or another input) is malformed: the message names file, line, field and allowed values."""


class UnknownSku(Fa4AotError, LookupError):
    """A SKU name or a detected device matches no entry of the SKU table."""


class HostMismatch(UnknownSku):
    """This host's CPU cannot run the host code its SKU's kernels were built for (domain/hosts.py): another
    architecture, or an instruction-set baseline beyond the CPU."""


class KernelMissing(Fa4AotError, LookupError):
    """Strict mode met a kernel that the store does not hold."""

    def __init__(self, message: str, *, sku: str, family: str, kernel_key: str, compile_key: str) -> None:
        super().__init__(message)
        self.sku = sku
        self.family = family
        self.kernel_key = kernel_key
        self.compile_key = compile_key


class IntegrityError(Fa4AotError):
    """Bytes on disk do not match the digest that names them."""

    def __init__(self, message: str, *, expected: str, actual: str, source: str) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual
        self.source = source


class StoreError(Fa4AotError):
    """The store cannot be used as asked (malformed id, lock timeout, unreadable entry)."""


class BuildError(Fa4AotError):
    """A build could not run, or some of its kernels failed to compile."""


class DiskFull(StoreError):
    """A write ran out of space (ENOSPC, EFBIG, EDQUOT). Nothing partial was left behind. Picklable, so it
    crosses from build workers to the CLI unchanged."""


class TrustError(Fa4AotError):
    """A manifest, key or kernel failed verification; the message says which check and how to fix it."""


class RemoteError(Fa4AotError):
    """The server could not be reached or refused a request; the message names the server and the fix."""


class RemoteAuthError(RemoteError):
    """The server refused the token (401/403): every other request of the command would fail the same way."""


class Unreachable(RemoteError):
    """The server could not be reached after retries: every other request of the command would fail too."""


class DatabaseError(Fa4AotError):
    """The service's database URL cannot be used (unsupported driver, unreachable server)."""


class KernelRefused(Fa4AotError, RuntimeError):
    """A kernel is not launched: the known-bad registry names it, or its certification on this device class
    failed (or, under FA4_AOT_CERTIFIED=require, it has no passing verdict). The message names the symptom and
    its source."""

    def __init__(self, message: str, *, kernel_key: str, reason: str) -> None:
        super().__init__(message)
        self.kernel_key = kernel_key
        self.reason = reason


class Unsupported(Fa4AotError, NotImplementedError):
    """An FA4 argument the lean runtime has no recipe for (score_mod, block sparsity, ...): run FA4 itself over the
    store instead (fa4_aot.install()). The message names the argument."""
