"""The lean runtime's server fallback: a kernel or recipe file missing locally is fetched, never compiled.

With FA4_AOT_SERVER set (remote/transport.py: its deadlines, retries, and the server treated as down after it fails),
a region's missing kernels come in one bundle with this host arch's libraries (per kernel from servers without
bundles), and a missing or outdated recipe file per file. What comes in passes the client's trust policy
first (trust/policy.py: with trusted keys, listed by a valid signed manifest; without, only with FA4_AOT_INSECURE=1).
Never raises for the server's sake: why it could not help is kept in `error` for KernelMissing's message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import host_arch
from ..errors import Fa4AotError, RemoteError
from ..remote import lean_files
from ..store import Entry, Store
from ..trust.policy import Trust

if TYPE_CHECKING:  # httpx (through remote) is imported only when a server is configured
    from ..remote.http import Remote


class Fetcher:
    def __init__(self, remote: Remote, trust: Trust, store: Store) -> None:
        self.remote, self.trust, self.store = remote, trust, store
        self.arch = host_arch()
        self.error = ""
        self.fetched = 0  # kernels and recipe files downloaded
        self.incomplete = False  # the last kernels() answer left some out (bytes it did not send): ask again

    def _accept(self, entry: Entry) -> None:
        """Refuse (TrustError) a kernel whose library for this host the trust policy does not list."""
        if self.arch in entry.shared_libs:
            self.trust.check_library(entry, self.arch)
        else:
            self.trust.check(entry)

    def kernels(self, keys: list[str]) -> int:
        """Fetch kernels `keys` with this host's libraries; returns how many were stored (`incomplete` when the
        answer named kernels without all their bytes: those were not stored)."""
        self.error, self.incomplete = self.trust.refuse_remote(), False
        if self.error or not keys:
            return 0
        try:
            try:
                stored, skipped = self.remote.fetch_bundle(keys, self.store, accept=self._accept,
                                                           host_arch=self.arch)
            except RemoteError:  # an older server without bundles: one kernel at a time
                got = [self.remote.fetch_kernel(k, self.store, accept=self._accept, arches=lambda e: [self.arch])
                       for k in keys]
                stored, skipped = [e for e in got if e is not None], {}
        except Fa4AotError as e:  # unreachable, untrusted, or bytes that failed their digest
            self.error = str(e)
            return 0
        if skipped:
            self.error, self.incomplete = next(iter(skipped.values())), True
        self.fetched += len(stored)
        return len(stored)

    def recipe(self, sku: str, key: str) -> bool:
        """Fetch recipe file `key` of `sku` unless the store holds the bytes the server lists; True if stored."""
        self.error = self.trust.refuse_remote()
        if self.error:
            return False
        try:
            if not lean_files.fetch_recipe(self.store, self.remote, sku, key, self.trust):
                self.error = f"{self.remote.url} has no recipe file {key[:16]}… for {sku} either"
                return False
        except Fa4AotError as e:
            self.error = str(e)
            return False
        self.fetched += 1
        return True
