"""Load linked kernels (Entry.shared_libs) and their runtime libraries with tvm_ffi alone: no cutlass, no FA4.

Each library is hashed through an open descriptor (Store.verified_file) and then loaded through that very
descriptor (/proc/self/fd/N, behind a link named for its digest, since tvm_ffi picks its loader by file suffix and
dlopen takes an already loaded name for the same object): what runs is what was verified. The links live in one
private folder per batch of loads (`functions`: a region's kernels), removed when the batch ends: a lean process
leaves nothing behind, and a new signature pays one folder, not one per kernel (removing a folder took 0.25
ms median, up to 5 ms, on a busy ext4 disk: bench/lean_load_steps.py). The folders go in memory where the host has
a memory filesystem (config.link_dir), where making and removing them costs a twentieth of a disk's time. The CuTe
runtime (libcute_dsl_runtime.so, stored as an object by the build) is loaded first with RTLD_GLOBAL; a kernel's
DT_NEEDED entries then resolve to it and to the libtvm_ffi.so that `import tvm_ffi` loaded, by SONAME.

With a trust policy (trust.policy.Trust), a library and its runtime libraries load only if valid signed manifests list
them for the kernel and this host arch (check_library, before any byte is mapped). With a fetcher (fetch,
FA4_AOT_SERVER set), kernels missing locally, or stored without this host's library, are fetched first.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import host_arch, link_dir
from ..domain import kernel_keys
from ..domain.skus import Constants
from ..errors import ConfigError, KernelMissing
from ..store import Entry, Store

if TYPE_CHECKING:
    from ..domain.signature import Signature
    from ..trust.certified import Gate
    from ..trust.policy import Trust
    from .fetch import Fetcher

EXPORT_FUNCTION = "func"  # build.EXPORT_FUNCTION (not imported: build pulls in the build machinery)


class Libraries:
    """Kernel functions by kernel key, loaded once per process from one store."""

    def __init__(self, store: Store, sku_name: str, constants: Constants | None = None,
                 trust: Trust | None = None, fetcher: Fetcher | None = None, gate: Gate | None = None) -> None:
        self.store, self.trust, self.fetcher, self.gate = store, trust, fetcher, gate
        self.sku_name = sku_name
        self.constants = constants
        self.arch = host_arch()
        self._functions: dict[str, Any] = {}
        self._runtimes: dict[str, Any] = {}
        self._modules: list[Any] = []  # a tvm_ffi module unloads when collected; kernels live for the process
        self._loaded: dict[str, Entry] = {}  # kernel key -> the entry whose library was loaded (what the gate judges)
        self._links: Path | None = None  # the private link folder of the batch of loads under way (_batch)
        self._lock = threading.RLock()

    def function(self, kernel_key: str, family: str = "", sig: Signature | None = None,
                 sizes: Mapping[str, int | None] | None = None) -> Any:
        """The launchable function of kernel `kernel_key` (a base key), loaded once. KernelMissing when the store
        (and the server) lack it; KernelRefused when certification refuses it for a call of `sig` at `sizes`
        (domain/scopes.AXES; None: unknown)."""
        fn = self._functions.get(kernel_key)
        if fn is None:
            with self._lock, self._batch():
                fn = self._functions.get(kernel_key) or self._load(kernel_key, family)
                self._functions[kernel_key] = fn
        if self.gate is not None:  # after loading: a kernel fetched on first use is decided on like any other
            self.gate.admit(kernel_key, sig, self._judged, sizes)
        return fn

    def functions(self, kernels: Sequence[tuple[str, str]], sig: Signature | None = None,
                  sizes: Mapping[str, int | None] | None = None) -> list[Any]:
        """function() of each (kernel key, family) of `kernels`, in order; those not loaded yet are loaded in one
        batch (one link folder). Errors as function(), for the first kernel that fails."""
        if any(key not in self._functions for key, _family in kernels):
            with self._lock, self._batch():
                return [self.function(key, family, sig, sizes) for key, family in kernels]
        return [self.function(key, family, sig, sizes) for key, family in kernels]

    def _judged(self, kernel_key: str) -> Entry | None:
        """The entry the gate decides on: that of the library loaded for `kernel_key` (read when it was loaded),
        else the store's (_entry)."""
        found = self._loaded.get(kernel_key)
        return found if found is not None else self._entry(kernel_key)[0]

    def prefetch(self, base_keys: list[str]) -> None:
        """Fetch, in one request per round, the kernels of `base_keys` this store cannot load yet (base entries
        first; then the builds with this device's constants that they name; a round whose answer left bytes out
        is asked again once). Nothing without a fetcher."""
        for _round in range(3):
            wanted = [w for w in map(self._wanted, base_keys) if w] if self.fetcher is not None else []
            if self.fetcher is None or not wanted or (not self.fetcher.kernels(wanted) and not self.fetcher.incomplete):
                return

    def _wanted(self, base_key: str) -> str:
        """The key to fetch for `base_key` ('' when its kernel loads from the store as it is)."""
        entry, _why = self._entry(base_key)
        if entry is not None and self.store.has_library(entry, self.arch):
            return ""
        base = self.store.get_entry(base_key)
        if base is None or self.arch not in base.shared_libs:  # the base entry first: it names the constants
            return base_key
        try:
            return kernel_keys.device_key(base_key, base, self.constants)
        except ValueError:
            return ""

    def _load(self, kernel_key: str, family: str) -> Any:
        import tvm_ffi

        entry, why = self._entry(kernel_key)
        whole = entry is not None and self.store.has_library(entry, self.arch)
        if not whole and self.fetcher is not None:
            self.prefetch([kernel_key])  # a library whose bytes are missing is fetched again, with its kernel
            entry, why = self._entry(kernel_key)
            whole = entry is not None and self.store.has_library(entry, self.arch)
        lib = entry.shared_libs.get(self.arch) if entry is not None else None
        if entry is None or lib is None or not whole:
            why = (why or "is not in") if entry is None else (
                f"has no {self.arch} library (built before linking) in" if lib is None else
                f"names an {self.arch} library or runtime library that is missing from")
            server = f" nor on the server ({self.fetcher.error})" if self.fetcher is not None else ""
            raise KernelMissing(
                f"kernel {kernel_key[:16]}… ({family}) for SKU {self.sku_name} {why} {self.store.root}{server}; run "
                f"`fa4-aot build --sku {self.sku_name}` on an {self.arch} build host (it links stored kernels "
                "without recompiling them) and `fa4-aot push` it",
                sku=self.sku_name, family=family, kernel_key=kernel_key, compile_key="")
        if self.trust is not None:
            self.trust.check_library(entry, self.arch)
        for soname, digest in sorted(lib["needs"].items()):
            if digest:
                self._runtime(soname, digest)
        module = self._open(lib["digest"], ".so", tvm_ffi.load_module)
        self._modules.append(module)
        self._loaded[kernel_key] = entry
        return module[EXPORT_FUNCTION]

    def entry(self, base_key: str) -> Entry | None:
        """The local store's entry of the kernel with base key `base_key` for this device (see _entry), or None."""
        return self._entry(base_key)[0]

    def _entry(self, base_key: str) -> tuple[Entry | None, str]:
        """(the entry of the kernel with base key `base_key` for this device, or None; why not): the entry of
        kernel_keys.device_key (the base entry when its kernel consumed no SKU constant or no constants were
        given, else the build with the device's values), on the local store only."""
        base = self.store.get_entry(base_key)
        try:
            key = kernel_keys.device_key(base_key, base, self.constants)
        except ValueError as e:  # a constant this version cannot compute
            return None, f"cannot be chosen ({e}); it is not in"
        if key == base_key or base is None or self.constants is None:  # the base entry is the kernel
            return base, ""
        full = self.store.get_entry(key)
        if full is None:
            diff = ", ".join(f"{n} = {mine} (built: {theirs})"
                             for n, (theirs, mine) in kernel_keys.differing(base, self.constants).items())
            return None, f"consumed SKU constants and no build has this device's values ({diff}) in"
        return full, ""

    def _runtime(self, soname: str, digest: str) -> None:
        if soname not in self._runtimes:
            self._runtimes[soname] = self._open(digest, f"-{soname}",
                                                lambda p: ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL))

    def _open(self, digest: str, suffix: str, loader: Any) -> Any:
        """loader(path) where path reaches the verified bytes of object `digest` through their descriptor. The link
        lives in the batch's private folder only while the loader runs: once mapped, a library needs no path. Its
        name is the object's digest: a name dlopen has seen before (a folder name drawn again) names the same
        bytes. The caller holds the lock and a batch (function, functions)."""
        assert self._links is not None
        with self.store.verified_file(digest) as f:
            link = self._links / f"{digest}{suffix}"
            os.symlink(f"/proc/self/fd/{f.fileno()}", link)
            try:
                return loader(str(link))
            finally:
                link.unlink()

    @contextlib.contextmanager
    def _batch(self) -> Iterator[None]:
        """A private link folder for the loads inside (nested batches share the outermost's), removed when the
        outermost ends, also when a load fails. The caller holds the lock."""
        if self._links is not None:
            yield
            return
        try:
            parent = link_dir()
        except ValueError as e:  # a FA4_AOT_LINK_DIR that is not a safe folder
            raise ConfigError(str(e)) from None
        try:
            self._links = Path(tempfile.mkdtemp(prefix="fa4-aot-lean-", dir=parent))
        except OSError:  # e.g. a full /dev/shm (a container's is 64 MB, shared with data loaders): the temp directory
            self._links = Path(tempfile.mkdtemp(prefix="fa4-aot-lean-"))
        try:
            yield
        finally:
            links, self._links = self._links, None
            try:
                os.rmdir(links)  # empty: each link goes once its library is mapped (one call, not rmtree's walk)
            except OSError:
                shutil.rmtree(links, ignore_errors=True)
