"""Run FA4 from the store: `install()` makes FA4's compile caches read kernels from the store for the
detected SKU; `load()` plans a call signature, loads every kernel it needs, and returns a callable.

A kernel missing from the local store is fetched from the server when FA4_AOT_SERVER is set (see
remote.py). Strict mode never compiles: a kernel neither has raises KernelMissing naming the SKU, the
call and the command that adds it. Fallback mode lets FA4 compile it, records the miss (locally for
`fa4-aot misses`, and on the server for `fa4-aot build --from-misses`) and goes on.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import calls, config, keys
from .calls import Call
from .errors import Fa4AotError, KernelMissing, TrustError
from .skus import Sku, detect_device, select
from .store import Miss, Store
from .trust import Trust

if TYPE_CHECKING:  # httpx (through remote) is imported only when a server is configured: it costs cold starts
    from .remote import Remote

MODES = ("strict", "fallback")
FETCH_THREADS = 8


@dataclass
class Stats:
    loaded: int = 0  # kernels read from the store into this process
    fetched: int = 0  # kernels downloaded from the server into the store
    compiled: int = 0  # kernels FA4 compiled itself (fallback mode only)
    misses: list[str] = field(default_factory=list)  # kernel keys the store lacked


@dataclass
class Installation:
    sku: Sku
    store: Store
    mode: str
    trace: list[str]
    trust: Trust
    remote: Remote | None = None
    remote_error: str = ""  # why the server could not help, for strict mode's message
    stats: Stats = field(default_factory=Stats)

    def fetch(self, kernel_key: str) -> bool:
        """Download `kernel_key` from the server into the store, if the trust policy accepts it. False (never
        raises) when there is no server, it lacks the kernel, cannot be reached or the kernel is not trusted;
        the reason is kept for error messages."""
        if self.remote is None:
            return False
        from .errors import RemoteError

        self.remote_error = self.trust.refuse_remote()
        if self.remote_error:
            return False
        try:
            if self.remote.fetch_kernel(kernel_key, self.store, accept=self.trust.check) is None:
                self.remote_error = f"{self.remote.url} has no kernel {kernel_key[:16]}… for {self.sku.name} either"
                return False
        except (RemoteError, TrustError) as e:
            self.remote_error = str(e)
            return False
        self.stats.fetched += 1
        return True


    def fetch_many(self, kernel_keys: list[str]) -> int:
        """fetch() for several kernels: one request (a bundle) when the server offers it, else one by one on
        FETCH_THREADS threads. Returns how many were downloaded; never raises (reasons kept as in fetch())."""
        if self.remote is None or not kernel_keys:
            return 0
        from .remote import RemoteError

        self.remote_error = self.trust.refuse_remote()
        if self.remote_error:
            return 0
        try:
            stored, skipped = self.remote.fetch_bundle(kernel_keys, self.store, accept=self.trust.check)
        except RemoteError:  # an older server without bundles, or a broken one: the per-kernel path retries
            with ThreadPoolExecutor(min(FETCH_THREADS, len(kernel_keys))) as pool:
                return sum(pool.map(self.fetch, kernel_keys))
        except Fa4AotError as e:  # bytes that do not match their digest: nothing of them was stored
            self.remote_error = str(e)
            return 0
        if skipped:
            self.remote_error = next(iter(skipped.values()))
        self.stats.fetched += len(stored)
        return len(stored)


_installed: Installation | None = None


def installed() -> Installation | None:
    return _installed


def install(mode: str = "strict", *, cache_dir: Path | None = None, variants_file: Path | None = None) -> Installation:
    """Serve FA4's kernels from the store for this process's GPU. Idempotent for the same mode and store.

    Raises UnknownSku when the device matches no SKU (the message lists them and how to add one).
    """
    global _installed
    if mode not in MODES:
        raise ValueError(f"invalid mode {mode!r}: expected one of {', '.join(MODES)}")
    from . import caches, variants

    store = Store(cache_dir or config.default_cache_dir())
    if _installed and _installed.mode == mode and _installed.store.root == store.root:
        return _installed
    matrix = variants.load(variants_file or config.default_variants_file())
    sku, trace = select(matrix.skus, detect_device(), forced=os.environ.get("FA4_AOT_SKU"))
    remote = _remote_from_env()
    installation = Installation(sku=sku, store=store, mode=mode, trace=trace, remote=remote,
                                trust=Trust.from_env(sku, store, remote))
    calls.capture()
    caches.install(lambda family, _old: StoreCache(family, installation))
    _installed = installation
    return installation


def _remote_from_env() -> Remote | None:
    if config.server_url() is None:
        return None
    from .remote import server_from_env

    return server_from_env()


def _store_cache_base() -> type:
    from flash_attn.cute.cache_utils import JITCache

    return JITCache


class StoreCache(_store_cache_base()):  # type: ignore[misc]
    """FA4 compile cache backed by the store: a key FA4 asks for is loaded, verified, from its object."""

    def __init__(self, family: str, installation: Installation) -> None:
        super().__init__()
        self.family = family
        self.inst = installation

    def __contains__(self, key: Any) -> bool:
        if key in self.cache:
            return True
        kernel_key = keys.kernel_key(self.family, key, self.inst.sku)
        entry = self.inst.store.get_entry(kernel_key)
        if entry is None and self.inst.fetch(kernel_key):
            entry = self.inst.store.get_entry(kernel_key)
        if entry is not None and self._trusted(entry):
            self.cache[key] = load_object(self.inst.store.verified_object_path(entry.object_digest))
            self.inst.stats.loaded += 1
            return True
        self._miss(key, kernel_key)
        return False

    def _trusted(self, entry: Any) -> bool:
        """Strict mode raises TrustError for a kernel no trusted manifest lists; fallback treats it as a miss."""
        try:
            self.inst.trust.check(entry)
        except TrustError:
            if self.inst.mode == "strict":
                raise
            return False
        return True

    def __setitem__(self, key: Any, fn: Any) -> None:
        self.cache[key] = fn
        self.inst.stats.compiled += 1

    def _miss(self, key: Any, kernel_key: str) -> None:
        inst = self.inst
        call = calls.current()
        what = call.describe() if call else f"{self.family} compile key {keys.dumps(keys.canonical(key))[:200]}"
        miss = Miss(kernel_key=kernel_key, family=self.family, compile_key=keys.canonical(key), sku=inst.sku.name,
                    call=call.to_dict() if call else None)
        if inst.remote is not None:
            inst.remote.report_miss(asdict(miss))
        if inst.mode == "strict":
            server = f" nor on the server ({inst.remote_error})" if inst.remote else ""
            raise KernelMissing(
                f"kernel {kernel_key[:16]}… ({self.family}) for SKU {inst.sku.name} is not in {inst.store.root}"
                f"{server}; needed by: {what}. Add a [[variants]] entry covering it to variants.toml and run "
                f"`fa4-aot build --sku {inst.sku.name}`, or use fa4_aot.install(mode=\"fallback\")",
                sku=inst.sku.name, family=self.family, kernel_key=kernel_key,
                compile_key=keys.dumps(keys.canonical(key)),
            )
        inst.stats.misses.append(kernel_key)
        inst.store.record_miss(miss)


def load_object(path: Path) -> Any:
    """Load an exported kernel object as FA4's own persistent cache does (cache_utils.JITPersistentCache)."""
    import cutlass.cute as cute

    from .worker import EXPORT_FUNCTION

    module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
    return getattr(module, EXPORT_FUNCTION)


class AttentionFn:
    """A loaded call signature: calling it runs FA4 (flash_attn_func or flash_attn_varlen_func) with the
    flags it was loaded for; tensors and per-call arguments (cu_seqlens, page_table...) come at call time."""

    def __init__(self, call: Call, installation: Installation, kernels: list[str]) -> None:
        self.call = call
        self.installation = installation
        self.kernel_keys = kernels

    def __call__(self, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

        c = self.call
        flags: dict[str, Any] = {
            "causal": c.mask == "causal",
            "window_size": c.window if c.mask == "local" else (None, None),
            "softcap": c.softcap,
            "num_splits": c.num_splits,
            "deterministic": c.pass_ == "bwd_det",
            "return_lse": c.pass_ == "fwd_lse",
        }
        flags.update(kwargs)
        with calls.running(c):
            if c.layout == "dense":
                return flash_attn_func(q, k, v, **flags)
            return flash_attn_varlen_func(q, k, v, **flags)


def load(
    q_shape: tuple[int, int, int, int],
    k_shape: tuple[int, int, int, int] | None = None,
    *,
    causal: bool = False,
    dtype: Any = None,
    window_size: tuple[int | None, int | None] = (None, None),
    softcap: float = 0.0,
    learnable_sink: bool = False,
    num_splits: int = 1,
    layout: str = "dense",
    page_size: int = 0,
    training: bool = False,
    deterministic: bool = False,
    return_lse: bool = False,
    mode: str | None = None,
    cache_dir: Path | None = None,
) -> AttentionFn:
    """Load every kernel FA4 needs for this signature, then return a callable with FA4's semantics.

    q_shape is (batch, seqlen_q, heads, head_dim) and k_shape (batch, seqlen_k, heads_kv, head_dim_v)
    in logical form for every layout ("dense", "varlen", "seqused", "paged"): for varlen they are the
    batch size and the max sequence lengths. Installs fa4_aot in `mode` (default strict) if needed.
    Raises KernelMissing in strict mode before returning if any kernel is absent.
    """
    from . import plan

    inst = install(mode or (_installed.mode if _installed else "strict"), cache_dir=cache_dir)
    call = _call_from(q_shape, k_shape, causal=causal, dtype=dtype, window_size=window_size, softcap=softcap,
                      sink=learnable_sink, num_splits=num_splits, layout=layout, page_size=page_size,
                      training=training, deterministic=deterministic, return_lse=return_lse)
    from . import caches

    needed = plan.kernels_for(call)
    kernel_keys = [keys.kernel_key(family, key, inst.sku) for (family, _), key in needed.items()]
    absent = [kk for kk in kernel_keys if not inst.store.has_entry(kk)]
    inst.fetch_many(absent)
    functions = caches.fa4_functions()
    with calls.running(call):
        for (family, _), key in needed.items():
            functions[family].compile_cache.__contains__(key)  # loads, or raises/records the miss
    return AttentionFn(call, inst, kernel_keys)


def _call_from(q_shape: tuple[int, ...], k_shape: tuple[int, ...] | None, *, causal: bool, dtype: Any,
               window_size: tuple[int | None, int | None], softcap: float, sink: bool, num_splits: int,
               layout: str, page_size: int, training: bool, deterministic: bool, return_lse: bool) -> Call:
    import torch

    if len(q_shape) != 4 or (k_shape is not None and len(k_shape) != 4):
        raise ValueError("q_shape and k_shape are (batch, seqlen, heads, head_dim) for every layout")
    k_shape = k_shape or q_shape
    dtype = dtype or torch.bfloat16
    names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    if dtype not in names:
        raise ValueError(f"dtype {dtype} is not supported: FA4 kernels here are bf16 or fp16")
    local = window_size != (None, None)
    if local and None in window_size:
        raise ValueError(f"window_size={window_size}: give both sides as integers for a local window")
    if local and causal:
        raise ValueError("pass either causal=True or a window_size, as FA4 treats causal as window (None, 0)")
    if layout == "paged" and page_size <= 0:
        raise ValueError("layout='paged' needs page_size")
    return Call(
        layout=layout,
        pass_=("bwd_det" if deterministic else "bwd") if training else ("fwd_lse" if return_lse else "fwd"),
        dtype=names[dtype], head_dim=q_shape[3], head_dim_v=k_shape[3],
        mask="causal" if causal else "local" if local else "full",
        window=(int(window_size[0]), int(window_size[1])) if local else (0, 0),  # type: ignore[arg-type]
        softcap=float(softcap), sink=sink, num_splits=num_splits, batch=q_shape[0], seqlen_q=q_shape[1],
        seqlen_k=k_shape[1], heads_q=q_shape[2], heads_kv=k_shape[2], page_size=page_size if layout == "paged" else 0,
    )
