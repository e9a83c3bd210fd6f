"""A new signature's first load runs with the process's older objects out of the collector's reach (runtime/heap.py):
a collection inside it, full or not, walks only the load's own objects, so the full collection that took 85-99 ms
in a process holding torch cannot land inside a first call; and every object is the collector's again after it.

The recipe file's read (Runtime.attention), the first forward's bind (Attention.bound) and the first backward's
(Bound.backward) each run inside the scope, on a real store with real libraries, no GPU. Before heap.py, each of
them ran with nothing frozen, and these tests failed."""

from __future__ import annotations

import gc
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.matrix import variants
from fa4_aot.runtime import heap, runner
from fa4_aot.runtime.call_args import signature
from fa4_aot.runtime.libraries import Libraries
from fa4_aot.store import Store, recipes
from tests.conftest import TINY_VARIANTS, build_json

SIZES = {"batch": 1, "seqlen_q": 512, "seqlen_k": 512}


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_inside_the_scope_only_new_objects_are_collectable_and_all_are_after() -> None:
    before = Cycle()
    with heap.young_only():
        assert gc.get_freeze_count() > 0  # `before` among them
        inside = Cycle()
        del inside
        assert gc.collect() >= 1  # the scope's own garbage is still collected
    assert gc.get_freeze_count() == 0  # nothing left frozen: the user's objects are collectable again
    del before
    assert gc.collect() >= 1


def test_a_process_that_froze_its_objects_keeps_them_frozen_and_nesting_is_one_scope() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with heap.young_only():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen  # not released by the scope's end
    finally:
        gc.unfreeze()
    with heap.young_only():
        with heap.young_only():
            pass
        assert gc.get_freeze_count() > 0  # the inner scope's end did not release the outer one's
    assert gc.get_freeze_count() == 0


def test_another_threads_scope_is_left_to_it() -> None:
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with heap.young_only():
            entered.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait(10)
    with heap.young_only():
        pass
    assert gc.get_freeze_count() > 0  # still the holder's
    leave.set()
    holder.join(10)
    assert gc.get_freeze_count() == 0


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("heap") / "store"
    build_json(store, "h200", "det-bwd")
    return store


def _frozen_during(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, seen: list[bool]) -> None:
    """Record, at each call of owner.name, whether the collector's older objects are frozen."""
    original = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_freeze_count() > 0)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)


def test_first_loads_run_inside_the_scope(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    shutil.copytree(built, root, symlinks=True)
    reads: list[bool] = []
    loads: list[bool] = []
    _frozen_during(monkeypatch, recipes, "load_lazy", reads)
    _frozen_during(monkeypatch, Libraries, "functions", loads)
    rt = runner.Runtime(Store(root), variants.load(TINY_VARIANTS).skus["h200"])
    attn = rt.attention(signature("dense", "torch.bfloat16", 16, 128, 16, 128, causal=True, training=True,
                                  deterministic=True))
    bound = attn.bound(SIZES, "cuda", None)
    assert bound.late is not None  # the backward's kernels wait for the first backward
    bound.backward()
    assert reads and all(reads), reads
    assert loads == [True, True]  # the forward's kernels, then the backward's
    assert gc.get_freeze_count() == 0
