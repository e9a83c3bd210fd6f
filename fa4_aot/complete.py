"""Shape-complete planning: every kernel FA4's dispatch can choose for a Signature at any batch size and
sequence lengths (seqlen_q up to 256k, seqlen_k up to 1M), for the SKU this process is configured for.

Runs FA4 on fake tensors with recording caches (plan.py) over the representative shapes of probes.py, in two
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

from . import probes
from .calls import Call
from .signature import Signature

Kernels = dict[tuple[str, str], tuple[Any, Call]]  # (family, canonical key JSON) -> (compile key, first call)


def kernels_for_signature(sig: Signature, sm_count: int) -> Kernels:
    """{(family, canonical compile key JSON): (compile key, a Call that needs it)} over every shape of `sig`.

    Must run in a process configured for the SKU (target.configure) whose SM count is `sm_count`. Calls FA4
    rejects at some shapes are skipped; raises ValueError when it rejects every shape of the signature.
    """
    return dict(_cached(sig, sm_count))


@lru_cache(maxsize=512)
def _cached(sig: Signature, sm_count: int) -> tuple[tuple[tuple[str, str], tuple[Any, Call]], ...]:
    found: Kernels = {}
    errors: list[str] = []
    rows = _phase1(sig, sm_count, found, errors)
    if len(probes.seqlens_k(sig)) > 1:
        _phase2(sig, sm_count, rows, found, errors)
    if not found:
        raise ValueError(f"FA4 rejects every shape of {sig.call(1, 1, 1).describe()}: {errors[0]}")
    return tuple(found.items())


def _phase1(sig: Signature, sm: int, found: Kernels, errors: list[str]) -> dict[tuple[int, int], tuple[Any, int]]:
    """{(batch, seqlen_q): (kernel set at seqlen_k = 1, total_mblocks per batch or 0)}."""
    rows = {}
    lengths_k = (1, probes.MAX_SEQLEN_K) if probes.splits_matter(sig) else (1,)
    for sq in probes.seqlens_q(sig):
        for b in probes.batch_regimes(sig, sm):
            base, per_batch = frozenset(), 0
            for sk in lengths_k:
                kernels, totals = _run(sig.call(b, sq, sk), found, errors)
                base = base or frozenset(kernels)
                per_batch = per_batch or (totals[0] // b if totals else 0)
            rows[(b, sq)] = (base, per_batch)
    return rows


def _phase2(sig: Signature, sm: int, rows: dict[tuple[int, int], tuple[Any, int]], found: Kernels,
            errors: list[str]) -> None:
    groups: dict[tuple[Any, int], tuple[int, int]] = {}
    for (b0, sq), (base, per_batch) in rows.items():
        if not base:
            continue
        same_regime = [b for b in {*probes.split_batches(sm), b0}
                       if probes.regime(sig, sm, b) == probes.regime(sig, sm, b0)]
        for b in sorted(same_regime):
            bucket = probes.split_bucket(per_batch, b, sm) if per_batch else -1
            groups.setdefault((base, bucket), (b, sq))
    for b, sq in groups.values():
        for sk in probes.seqlens_k(sig):
            _run(sig.call(b, sq, sk), found, errors)


def _run(call: Call, found: Kernels, errors: list[str]) -> tuple[list[tuple[str, str]], list[int]]:
    """Plan one call; add its kernels to `found`. Returns its kernel idents and the total_mblocks values FA4's
    split heuristic was called with ([] when it was not)."""
    from . import plan

    with _heuristic_inputs() as totals:
        try:
            seen = plan.kernels_for(call)
        except Exception as e:  # FA4 rejects this shape (e.g. a layout limit): other shapes may still run
            errors.append(f"{type(e).__name__}: {e}")
            return [], []
    for ident, key in seen.items():
        found.setdefault(ident, (key, call))
    return list(seen), list(totals)


@contextmanager
def _heuristic_inputs() -> Iterator[list[int]]:
    """Record total_mblocks of every num_splits_heuristic call FA4 makes inside the block."""
    from flash_attn.cute import interface

    original = interface.num_splits_heuristic
    totals: list[int] = []

    def recording(total_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
        totals.append(int(total_mblocks))
        return int(original(total_mblocks, num_sms, num_n_blocks, max_splits))

    interface.num_splits_heuristic = recording
    try:
        yield totals
    finally:
        interface.num_splits_heuristic = original
