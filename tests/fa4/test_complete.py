"""Shape-complete plans hold every kernel FA4's real dispatch picks at random shapes, for h200 and b200.

Each signature class (layout x pass x mask x GQA ratio x head dims x softcap/sink x split-KV) is planned once
with fa4.plan_signature (fa4_aot/fa4/complete.py), then SHAPES random (batch, seqlen_q, seqlen_k) are run through FA4 on
fake tensors with recording caches: any kernel outside the plan fails the test with the shape that needs it.
The seed is printed; FA4_AOT_SEED=<seed> replays a run, FA4_AOT_SHAPES=<n> changes the count.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from fa4_aot.domain.signature import Signature
from fa4_aot.domain.skus import Sku

H200 = Sku("h200", "sm_90a", 132, 62914560, 13)
B200 = Sku("b200", "sm_100a", 148, 132644864, 13)
SHAPES = int(os.environ.get("FA4_AOT_SHAPES", "2000"))


def sig(layout: str = "dense", pass_: str = "fwd", d: int = 128, dv: int | None = None, mask: str = "causal",
        heads: tuple[int, int] = (32, 8), window: tuple[int, int] = (0, 0), softcap: float = 0.0,
        sink: bool = False, splits: int = 1, dtype: str = "bf16", page: int = 0) -> Signature:
    return Signature(layout=layout, pass_=pass_, dtype=dtype, head_dim=d, head_dim_v=dv or d, mask=mask,
                     window=window, softcap=softcap, sink=sink, num_splits=splits, heads_q=heads[0],
                     heads_kv=heads[1], page_size=page)


CLASSES = [
    sig(),                                                                   # prefill, GQA 4
    sig(pass_="bwd", heads=(64, 8)),                                         # training, GQA 8
    sig(pass_="bwd_det", d=64, mask="full", heads=(16, 16)),                 # deterministic, MHA encoder
    sig(pass_="fwd_lse", d=96, mask="full", heads=(28, 4)),                  # GQA 7
    sig(d=256, mask="local", window=(512, 0), heads=(16, 8), softcap=30.0),  # Gemma-like
    sig(d=256, heads=(8, 1), splits=0),                                      # MQA decode, split heuristic
    sig(d=192, dv=128, mask="full", heads=(16, 16), splits=0),               # DeepSeek dims
    sig(layout="varlen", pass_="bwd", heads=(40, 8)),                        # packed training, GQA 5
    sig(layout="varlen", d=64, heads=(32, 8), splits=0, sink=True),          # GPT-OSS-like serving
    sig(layout="seqused", heads=(32, 4), splits=0),                          # KV cache with lengths
    sig(layout="paged", heads=(32, 8), splits=0, page=128),                  # paged decode
    sig(layout="paged", d=64, mask="local", window=(128, 0), heads=(64, 8), splits=0, page=64),
    sig(d=128, dv=64, mask="full", heads=(24, 12)),                          # qk 128 / v 64
    sig(pass_="bwd", mask="local", window=(128, 0), heads=(32, 8), sink=True),
    sig(heads=(32, 8), splits=4),                                            # fixed split count
    sig(layout="varlen", pass_="bwd_det", d=192, dv=128, mask="full", heads=(16, 16)),
    sig(pass_="fwd_lse", d=72, heads=(12, 12), splits=0),                    # odd head dim, MHA
    sig(dtype="fp16", heads=(48, 8), splits=0, softcap=50.0),                # GQA 6, fp16
]


def draw(rng: random.Random) -> tuple[int, int, int]:
    """A random (batch, seqlen_q, seqlen_k): decode, tiny, odd and huge lengths, seqlen_k < seqlen_q,
    large batches; total tokens kept under 2^27 so that every draw is a call a GPU could hold."""
    def log_uniform(hi: int) -> int:
        return max(1, int(math.exp(rng.uniform(0, math.log(hi + 1)))))

    kind = rng.random()
    batch = 1 if rng.random() < 0.3 else log_uniform(2048)
    if kind < 0.2:
        sq = 1  # decode
    elif kind < 0.35:
        sq = rng.randint(1, 16)  # tiny / speculative decoding
    elif kind < 0.5:
        sq = rng.randint(1, 512)  # around every tile threshold
    else:
        sq = log_uniform(256 * 1024)
    sk = sq if rng.random() < 0.2 else log_uniform(1024 * 1024)  # often seqlen_k < seqlen_q too
    while batch > 1 and batch * max(sq, sk) > 2**27:
        batch //= 2
    while batch * max(sq, sk) > 2**27:
        sk, sq = max(1, sk // 2), max(1, sq // 2)
    return batch, sq, sk


def _init(sku: Sku) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    from fa4_aot import fa4

    fa4.configure(sku)


def check(args: tuple[Sku, int, int, int]) -> dict[str, Any]:
    """Plan class `index` for `sku`, then run `count` random shapes; the kernels outside the plan."""
    from fa4_aot import fa4

    sku, index, seed, count = args
    signature = CLASSES[index]
    started, cpu = time.perf_counter(), time.process_time()
    try:
        planned = fa4.plan_signature(signature, sku)
    except ValueError as e:
        return {"index": index, "unsupported": str(e)}
    plan_seconds = time.perf_counter() - started
    rng = random.Random(seed * 1000 + index)
    outside: dict[str, str] = {}
    rejected = 0
    shapes = [draw(rng) for _ in range(count)]
    for (b, sq, sk), seen in zip(shapes, fa4.plan_each([signature.call(*s) for s in shapes]),
                                 strict=True):
        if seen is None:
            rejected += 1
            continue
        for family, ident in seen:
            if (family, ident) not in planned:
                outside.setdefault(f"{family} {ident[:160]}", f"batch={b} seqlen_q={sq} seqlen_k={sk}")
    return {"index": index, "kernels": len(planned), "plan_seconds": plan_seconds, "outside": outside,
            "rejected": rejected, "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu}


SEED = int(os.environ.get("FA4_AOT_SEED", str(random.SystemRandom().randrange(10**6))))


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    """Both SKUs checked at once, one process each (2 cores)."""
    context = multiprocessing.get_context("spawn")
    pools = {sku.name: ProcessPoolExecutor(1, mp_context=context, initializer=_init, initargs=(sku,))
             for sku in (H200, B200)}
    try:
        futures = {sku.name: [pools[sku.name].submit(check, (sku, i, SEED, SHAPES)) for i in range(len(CLASSES))]
                   for sku in (H200, B200)}
        return {name: [f.result() for f in fs] for name, fs in futures.items()}
    finally:
        for pool in pools.values():
            pool.shutdown()


@pytest.mark.parametrize("sku", [H200, B200], ids=["h200", "b200"])
def test_random_shapes_need_no_kernel_outside_the_plan(sku: Sku, results: dict[str, list[dict[str, Any]]]) -> None:
    print(f"\nseed {SEED} (replay: FA4_AOT_SEED={SEED}), {SHAPES} shapes per class, {sku.name}")
    problems = []
    for r in results[sku.name]:
        label = CLASSES[r["index"]].call(0, 0, 0).describe().replace(" b=0 sq=0 sk=0", "")
        if "unsupported" in r:
            print(f"  {label}: FA4 rejects it on {sku.name}")
            continue
        print(f"  {label}: {r['kernels']} kernels, plan {r['plan_seconds']:.2f}s, {r['rejected']} shapes "
              f"rejected by FA4, {r['seconds']:.1f}s")
        problems += [f"{label}: {k} needed at {where}" for k, where in r["outside"].items()]
    assert not problems, f"seed {SEED}: kernels outside the plan:\n" + "\n".join(problems)
    assert sum("unsupported" not in r for r in results[sku.name]) >= len(CLASSES) - 3
