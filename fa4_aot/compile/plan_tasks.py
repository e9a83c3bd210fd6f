"""How planning's work items are cut into tasks for the executor's workers.

A dry run plans only: its tasks are strided over the items, a few each (progress as it goes, every worker
busy). A build also explores each item's signatures for the lean runtime's recipe regions (lean.explored), and
a worker counts the regions it already recorded under a recipe key (one file per GQA ratio) before recording
more: so items whose signatures share a recipe key go to one task, where the first explores the key's size
space and the others mostly find it covered. Strided, the default h200 matrix explored 666 recipe keys 4,046
times, about 3,200 of them from scratch in some worker.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence


def strided(items: Sequence[int], tasks: int) -> list[list[int]]:
    """`items` cut into at most `tasks` tasks, task i holding items i, i + tasks, ..."""
    n = max(1, min(tasks, len(items)))
    return [list(items[i::n]) for i in range(n)]


def by_shared_keys(items: Sequence[int], keys: Callable[[int], Sequence[Hashable]]) -> list[list[int]]:
    """`items` grouped so that items sharing a key (directly or through other items) are in one task, each
    task in the order of `items`, the largest tasks first (they finish last when started last)."""
    parent: dict[Hashable, Hashable] = {}

    def root(x: Hashable) -> Hashable:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    anchor: dict[int, Hashable] = {}
    for i in items:
        own = [("key", k) for k in keys(i)] or [("item", i)]  # an item without keys is a task of its own
        for k in own[1:]:
            parent[root(k)] = root(own[0])
        anchor[i] = own[0]
    groups: dict[Hashable, list[int]] = {}
    for i in items:
        groups.setdefault(root(anchor[i]), []).append(i)
    return sorted(groups.values(), key=len, reverse=True)
