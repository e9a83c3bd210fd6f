"""FA4's L2 budgets as SKU constants a compile consumes, so that a kernel scheduled for one L2 size is never
served, under a shared key, to a GPU with another.

FA4 hard-codes two L2 budgets, tuned on the H100 (50 MiB L2):
- `size_l2 = 50 * 1024 * 1024` in flash_attn/cute/tile_scheduler.py, three times (the LPT forward and backward
  schedulers' head swizzle, and the varlen decoder): how many heads' K/V (backward: Q/dO and dQaccum) are
  walked together so that they stay in L2;
- `self.size_l2 = (32 * 1024 * 1024) // divisor` in prepare_scheduler.py's FlashPrepareScheduler.
`patch(sku)` makes every one of them ask skus.Constants for `l2_budget` / `prepare_l2_budget` and record the
answer as consumed (consumed.consume), so the kernels they change carry the value in their key. With the SKU's
`l2_budget` off the answers are FA4's own figures: the bytes do not change, and the value is the same for every
SKU, so kernels stay shared. On, they follow the SKU's L2 (skus.l2_budgets).

The tile scheduler's budgets are locals of @cute.jit functions, which CuTe re-parses from their source
(inspect.getsourcelines, i.e. linecache) when it traces them: the patch gives linecache that file with the
constant replaced by a call, same line count, same size and mtime (so linecache keeps it). It runs before any
compile in the process; a source that no longer has exactly the expected lines fails the build with the FA4
version to look at, instead of compiling kernels whose key would lie.
"""

from __future__ import annotations

import inspect
import linecache
import os
from typing import Any

from ..domain.skus import Sku
from ..errors import BuildError
from .consumed import consume

_FA4_LINE = "size_l2 = 50 * 1024 * 1024"
_OUR_LINE = "size_l2 = _fa4_aot_l2_budget()"
_SITES = 3  # SingleTileLPTScheduler, SingleTileLPTBwdScheduler, VarlenDecoder in FA4 4.0.0b36


def patch(sku: Sku) -> None:
    """Route FA4's L2 budgets through `sku`'s constants in this process (see the module)."""
    import flash_attn.cute.prepare_scheduler as prepare
    import flash_attn.cute.tile_scheduler as tiles

    _patch_source(tiles, lambda: consume("l2_budget", sku))
    scheduler = prepare.FlashPrepareScheduler
    original = getattr(scheduler.__init__, "_fa4_aot_original", scheduler.__init__)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        budget = consume("prepare_l2_budget", sku)
        self.size_l2 = budget // self.size_l2_divisor  # as FA4 derives both from its 32 MiB
        self.max_kvblocks_in_l2 = (self.size_l2 + self.size_one_kvblock - 1) // self.size_one_kvblock

    init._fa4_aot_original = original  # type: ignore[attr-defined]
    scheduler.__init__ = init


def _patch_source(module: Any, budget: Any) -> None:
    path = inspect.getsourcefile(module)
    if path is None:
        raise BuildError(f"{module.__name__} has no source file; fa4-aot needs FA4's Python sources to compile")
    with open(path) as f:
        lines = f.readlines()
    sites = [i for i, line in enumerate(lines) if line.strip().startswith(_FA4_LINE)]
    if len(sites) != _SITES:
        from .versions import toolchain

        raise BuildError(
            f"{path} has {len(sites)} lines `{_FA4_LINE}`, fa4_aot/fa4/l2.py expects {_SITES} (FA4 "
            f"{toolchain().get('flash-attn-4')}): FA4's L2 budgets moved; update the patch before building")
    for i in sites:
        lines[i] = lines[i].replace(_FA4_LINE, _OUR_LINE, 1)
    st = os.stat(path)
    linecache.cache[path] = (st.st_size, st.st_mtime, lines, path)
    module._fa4_aot_l2_budget = budget
