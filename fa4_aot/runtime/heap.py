"""Garbage collection during a signature's first load: collections then see only the objects the load made.

A new signature's first call reads and checks its recipe file and binds its kernels: thousands of small containers
(JSON's dicts and lists, regions, steps), so the collector runs several young collections inside the call, and now
and then one of them is the full collection that walks every object of the process. In a process holding torch that
walk took 85-99 ms on the H200 host, inside the call it happened to fall into (bench/RESULTS.md).

`young_only()` moves every object that exists when the load starts to the collector's permanent generation
(`gc.freeze()`) and moves them back into the oldest generation when it ends (`gc.unfreeze()`). Both are list splices,
constant time whatever the heap's size. In between, a collection, full or not, walks only the load's own objects.
Nothing is kept from the collector: every object is collectable again when the load ends. The price is a delay:
objects that were young when the load began come back in the oldest generation, so a cycle among them that is
garbage waits for the next full collection rather than a young one. freeze() also zeroes the generations' counters,
so the next collection of each falls later, outside the call (bench/lean_first_load_gc.py: a full collection made
due before a first forward lands in the caller's next allocations instead).

It does nothing where something else holds the permanent generation: a process that froze objects itself (a
server freezing before fork) keeps them frozen, since unfreeze() would release them too; and while another thread's
load is inside the scope (one lock, never waited for).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_scope = threading.Lock()


@contextmanager
def young_only() -> Iterator[None]:
    """Inside it, collections walk only objects made inside it (see the module's docstring); never raises."""
    if not _scope.acquire(blocking=False):  # another thread's load holds the scope: it unfreezes at its end
        yield
        return
    try:
        # get_freeze_count() walks the permanent generation: constant time while it is empty, the usual case
        if gc.get_freeze_count():
            yield
            return
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
    finally:
        _scope.release()
