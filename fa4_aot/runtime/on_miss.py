"""The lean runtime's misses: a call that no recorded region serves is recorded locally (the
store's misses/, which `fa4-aot misses` lists and `fa4-aot build --from-misses` builds, and FA4_AOT_RECORD) and on
the server with its Call, as the FA4 path records a missing kernel; a build of that Call makes its kernels,
libraries and recipe regions. With FA4_AOT_BUILD_WAIT the runtime waits for the server's build (remote/wait.py).

A lean miss names no kernel: its key is the sha256 of its Call and SKU (domain/misses.py: Miss.lean, family
"recipe"), so every client missing one call reports one key, and the server builds it once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..domain import call_log
from ..domain.calls import Call
from ..domain.misses import Miss
from ..domain.region import Region
from ..domain.signature import Signature
from ..errors import Fa4AotError
from ..remote import wait as build_wait
from ..store import recipes

if TYPE_CHECKING:
    from ..domain.skus import Sku
    from ..store import Store
    from .fetch import Fetcher
    from .libraries import Libraries


class Parts(Protocol):
    """What after_miss reads of a runtime (runner.Runtime is one)."""

    store: Store
    sku: Sku
    fetcher: Fetcher | None
    libraries: Libraries


class Missed(Protocol):
    """What after_miss reads and reloads of a signature's attention (runner.Attention is one)."""

    sig: Signature
    regions: list[recipes.Stored]

    @property
    def rt(self) -> Parts: ...

    def reload(self) -> None: ...


def call_of(sig: Signature, sizes: dict[str, int]) -> Call:
    """The Call of a lean call's signature and recipe sizes (api: max lengths where the layout has them)."""
    seqlen_q = sizes.get("max_seqlen_q", sizes.get("seqlen_q", 0))
    seqlen_k = sizes.get("max_seqlen_k", sizes.get("seqlen_k", 0))
    return sig.call(sizes["batch"], seqlen_q, seqlen_k)


_noted: set[tuple[Path, str]] = set()  # (store, miss key) recorded by this process: once is enough


def note(store: Store, miss: Miss, call: Call) -> bool:
    """Record `miss` in `store` (misses/) and `call` in $FA4_AOT_RECORD, once per process; True the first time.
    Never raises: a read-only store must not turn a miss into another error."""
    if (store.root, miss.kernel_key) in _noted:
        return False
    _noted.add((store.root, miss.kernel_key))
    call_log.note(call)
    try:
        store.record_miss(miss)
    except (OSError, Fa4AotError):
        pass
    return True


def after_miss(attn: Missed, sizes: dict[str, int]) -> Region | None:
    """Record the miss of `attn` at `sizes` and report it to the server; with FA4_AOT_BUILD_WAIT, wait for its
    build and return the region it recorded (None when the wait did not help: the reason is in the fetcher's
    `error`). Without a server or a wait: None at once."""
    rt = attn.rt
    call = call_of(attn.sig, sizes)
    miss = Miss.lean(call, rt.sku.name)
    first = note(rt.store, miss, call)
    if rt.fetcher is None:
        return None
    deadline = build_wait.seconds()
    if not deadline:
        if first:  # a call that misses on every step is reported once
            rt.fetcher.remote.report_miss(miss)
        return None
    end = time.monotonic() + deadline
    _job, problem = build_wait.wait(rt.fetcher.remote, miss, deadline)
    if problem:
        rt.fetcher.error = problem
        return None
    attn.reload()
    stored = recipes.find(attn.regions, sizes)
    if stored is None and not rt.fetcher.error:
        rt.fetcher.error = "its build is done, but the server's recipe file has no region for these sizes"
    found = stored.region() if stored is not None else None  # checked in full here (StoreError when refused)
    problem = certified(rt, found, end) if found is not None else ""
    if problem:
        rt.fetcher.error = problem
        return None
    return found


def certified(rt: Parts, region: Region, end: float) -> str:
    """With FA4_AOT_CERTIFIED=require, fetch the kernels `region` launches and wait (until time.monotonic() reaches
    `end`) for their certification on this device, the verdicts kept in the store: '' once each passed (or when the
    policy does not require it), else why not (remote/wait.py)."""
    gate = rt.libraries.gate
    if gate is None or gate.policy != "require" or gate.device is None or rt.fetcher is None:
        return ""
    bases = [k.kernel_key for k in region.kernels]
    rt.libraries.prefetch(bases)  # the gate decides on entries it holds: the kernels come before their verdicts
    keys = [entry.kernel_key for entry in map(rt.libraries.entry, bases) if entry is not None]
    return build_wait.certified(rt.fetcher.remote, rt.store, keys, gate.device.id, end)
