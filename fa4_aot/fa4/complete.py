"""Shape-complete planning: every kernel FA4's dispatch can choose for a Signature at any batch size and
sequence lengths (seqlen_q up to 256k, seqlen_k up to 1M), for the SKU this process is configured for.

Runs FA4 on fake tensors with recording caches (kernels.py) over the representative shapes of domain/probes.py, in two
phases. Phase 1 runs each seqlen_q representative at one batch per batch regime, with seqlen_k = 1 (and 1M
when split-KV can happen), and notes total_mblocks as FA4's split heuristic sees it. Phase 2, when seqlen_k
can change the kernels (split-KV, backward), groups (batch, seqlen_q) by what the kernels can see of them
(the phase-1 kernel set and the split bucket reachable at that batch) and sweeps seqlen_k for one member of
each group.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from ..domain import probes
from ..domain.calls import Call
from ..domain.signature import Signature
from ..domain.skus import Sku
from . import caches, dispatch

Kernels = dict[tuple[str, str], tuple[Any, Call]]  # (family, canonical key JSON) -> (compile key, first call)


def kernels_for_signature(sig: Signature, sku: Sku) -> Kernels:
    """{(family, canonical compile key JSON): (compile key, a Call that needs it)} over every shape of `sig`, and
    for a training signature of its forward without LSE too (probes.forward_of: a model built for training then
    serves its forward-only calls, on either runtime).

    Must run in a process configured for `sku` (fa4.configure). Calls FA4
    rejects at some shapes are skipped; raises ValueError when it rejects every shape of the signature.
    """
    found = dict(_cached(sig, sku))
    for forward in probes.forward_of(sig):
        for ident, planned in _cached(forward, sku):
            found.setdefault(ident, planned)
    return found


def kernels_for_each(calls: list[Call]) -> list[dict[tuple[str, str], Any] | None]:
    """kernels.plan of each call ({(family, canonical key JSON): compile key}), in one fake-tensor mode:
    a fifth faster per call, for checking many calls. A call FA4 rejects gets None instead of a dict."""
    out: list[Any] = []
    with _recording():
        for call in calls:
            found: Kernels = {}
            idents, _totals = _run(call, found, [])
            out.append({ident: found[ident][0] for ident in idents} if idents or not _state.get("error") else None)
    return out


@lru_cache(maxsize=512)
def _cached(sig: Signature, sku: Sku) -> tuple[tuple[tuple[str, str], tuple[Any, Call]], ...]:
    found: Kernels = {}
    errors: list[str] = []
    with _recording():
        rows = _phase1(sig, sku, found, errors)
        if len(probes.seqlens_k(sig)) > 1:
            _phase2(sig, sku, rows, found, errors)
    if not found:
        raise ValueError(f"FA4 rejects every shape of {sig.call(1, 1, 1).describe()}: {errors[0]}")
    return tuple(found.items())


def _phase1(sig: Signature, sku: Sku, found: Kernels, errors: list[str]) -> dict[tuple[int, int], tuple[Any, int]]:
    """{(batch, seqlen_q): (kernel set at seqlen_k = 1, total_mblocks per batch or 0)}."""
    rows = {}
    # the heuristic runs at seqlen_k = 1 for num_splits = 0; a fixed N reaches it (sm100, head_dim != head_dim_v)
    # only once num_n_blocks >= 64
    lengths_k = (1, probes.MAX_SEQLEN_K) if sig.num_splits > 1 else (1,)
    for sq in probes.seqlens_q(sig):
        for b in probes.batch_regimes(sig, sku):
            base: frozenset[tuple[str, str]] = frozenset()
            per_batch = 0
            for sk in lengths_k:
                kernels, totals = _run(sig.call(b, sq, sk), found, errors)
                base = base or frozenset(kernels)
                per_batch = per_batch or (totals[0] // b if totals else 0)
            rows[(b, sq)] = (base, per_batch)
    return rows


def _phase2(sig: Signature, sku: Sku, rows: dict[tuple[int, int], tuple[Any, int]], found: Kernels,
            errors: list[str]) -> None:
    groups: dict[tuple[Any, int], tuple[int, int]] = {}
    for (b0, sq), (base, per_batch) in rows.items():
        if not base:
            continue
        same_regime = [b for b in {*probes.split_batches(sku.sm_count), b0}
                       if probes.regime(sig, sku, b) == probes.regime(sig, sku, b0)]
        for b in sorted(same_regime):
            bucket = probes.split_bucket(per_batch, b, sku.sm_count) if per_batch else -1
            groups.setdefault((base, bucket), (b, sq))
    for b, sq in groups.values():
        for sk in probes.seqlens_k(sig):
            _run(sig.call(b, sq, sk), found, errors)


def _run(call: Call, found: Kernels, errors: list[str]) -> tuple[list[tuple[str, str]], list[int]]:
    """Plan one call inside _recording(); add its kernels to `found`. Returns its kernel idents and the
    total_mblocks values FA4's split heuristic was called with ([] when it was not)."""
    _state["seen"], _state["totals"], _state["error"] = {}, [], False
    try:
        dispatch.run(call)
    except Exception as e:  # FA4 rejects this shape (e.g. a layout limit): other shapes may still run
        errors.append(f"{type(e).__name__}: {e}")
        _state["error"] = True
        return [], []
    seen = _state["seen"]
    for ident, key in seen.items():
        found.setdefault(ident, (key, call))
    return list(seen), list(_state["totals"])


_state: dict[str, Any] = {}


@contextmanager
def _recording() -> Iterator[None]:
    """One fake-tensor mode and one set of recording caches for a whole signature (a fresh one per call costs
    a fifth of the time); num_splits_heuristic is wrapped to note its total_mblocks."""
    from flash_attn.cute import interface
    from torch._subclasses.fake_tensor import FakeTensorMode

    original = interface.num_splits_heuristic

    def noting(total_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
        _state["totals"].append(int(total_mblocks))
        return int(original(total_mblocks, num_sms, num_n_blocks, max_splits))

    interface.num_splits_heuristic = noting
    try:
        with FakeTensorMode(), caches.swapped(lambda family, _old: _LiveRecorder(family)):
            yield
    finally:
        interface.num_splits_heuristic = original
        _state.clear()


class _LiveRecorder(caches.Recorder):
    """caches.Recorder writing into the current call's dict."""

    def __init__(self, family: str) -> None:
        super().__init__(family, {})

    def __contains__(self, key: Any) -> bool:
        self.seen = _state["seen"]
        return bool(super().__contains__(key))
