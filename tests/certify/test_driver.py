"""The certification run (fa4_aot/certify/driver.py) around its pool: what it runs again, with a stand-in pool."""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from fa4_aot.certify import driver, pool
from fa4_aot.certify.plan import Check, Use
from fa4_aot.certify.pool import Outcome
from fa4_aot.domain.signature import Signature

SIG = Signature("varlen", "bwd", "bf16", 64, 64, "causal", (0, 0), 0.0, False, 1, 6, 1)


def _check(label: str, key: str) -> Check:
    return Check(SIG, {"batch": 1, "max_seqlen_q": 28, "max_seqlen_k": 2, "total_q": 1, "total_k": 1, "heads_kv": 1},
                 (Use("_flash_attn_bwd", key * 64),), "small", 1, label)


def _stand_in_pool(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Replace the driver's Pool by one that runs nothing: a check labelled "full" runs out of GPU memory on a
    shared GPU (jobs > 1), one labelled "always" everywhere, the others pass. Returns the (check id, jobs) it ran."""
    ran: list[tuple[str, int]] = []

    class Pool:
        def __init__(self, _root: Path, _sku: str, _gpus: list[int], jobs: int, *_: object, **__: object) -> None:
            self.jobs = jobs

        def run(self, pending: list[tuple[str, Check]], stop: Callable[[], bool],
                skip: Callable[[Check], bool]) -> Iterator[Outcome]:
            for ident, check in pending:
                ran.append((ident, self.jobs))
                full = self.jobs > 1 and check.label in ("full", "always") or check.label == "always"
                yield Outcome(ident, check, "error" if full else "pass",
                              detail="AcceleratorError: CUDA error: out of memory" if full else "")

    monkeypatch.setattr(driver, "Pool", Pool)
    return ran


def test_h200_default_certify_out_of_memory_checks_run_again_with_the_gpu_to_themselves(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # at -j 16 on the H200 a tiny check met a GPU the other workers had filled: once more alone, it gets a verdict
    ran = _stand_in_pool(monkeypatch)
    journal = tmp_path / "journal.jsonl"
    run = driver._Run(SimpleNamespace(root=tmp_path), SimpleNamespace(name="h200"),  # type: ignore[arg-type]
                      driver.Options(jobs=16, gpus=(0,), journal=journal), {}, 3, None, lambda: False)
    run.all([("a", _check("fits", "a")), ("b", _check("full", "b")), ("c", _check("always", "c"))])
    assert ran == [("a", 16), ("b", 16), ("c", 16), ("b", 1), ("c", 1)]
    assert {i: o.status for i, o in run.found.items()} == {"a": "pass", "b": "pass", "c": "error"}
    assert set(driver.read_journal(journal)) == {"a", "b", "c"}  # the later outcome is the one a resume reads
    assert driver.read_journal(journal)["b"].status == "pass"


def test_wide_checks_run_last_with_the_gpu_to_themselves(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A wide check's KV pool (more than 2^31 elements of K and of V: about 11 GB in bf16) fits no worker's share at
    -j 16: wide checks run after the others, one worker per GPU, beside the checks that ran out of memory."""
    ran = _stand_in_pool(monkeypatch)
    wide = dataclasses.replace(_check("wide", "w"), kind="wide")
    for jobs, expected in ((16, [("a", 16), ("b", 16), ("w", 1), ("b", 1)]), (1, [("a", 1), ("b", 1), ("w", 1)])):
        ran.clear()
        run = driver._Run(SimpleNamespace(root=tmp_path), SimpleNamespace(name="h200"),  # type: ignore[arg-type]
                          driver.Options(jobs=jobs, gpus=(0,)), {}, 3, None, lambda: False)
        run.all([("w", wide), ("a", _check("fits", "a")), ("b", _check("full", "b"))])
        assert ran == expected
        assert {i: o.status for i, o in run.found.items()} == {"a": "pass", "b": "pass", "w": "pass"}


def _scripted_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's Pool with the real process handling, its workers scripted_worker.py (no GPU)."""
    script = [sys.executable, str(Path(__file__).with_name("scripted_worker.py"))]
    monkeypatch.setattr(driver, "Pool", functools.partial(pool.Pool, command=script, startup=60.0,
                                                          capacity=lambda _gpu: 64 << 30))


def test_certify_variants_reach_the_workers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`certify --variants FILE`: the workers read that SKU table too (they read the default table before)."""
    _scripted_pool(monkeypatch)
    table = tmp_path / "my-skus.toml"
    table.write_text("")
    monkeypatch.delenv("FA4_AOT_VARIANTS", raising=False)
    run = driver._Run(SimpleNamespace(root=tmp_path), SimpleNamespace(name="h100-sxm"),  # type: ignore[arg-type]
                      driver.Options(gpus=(0,), variants=table), {}, 1, None, lambda: False)
    run.all([("a", _check("variants", "a"))])
    assert run.found["a"].detail == str(table.resolve())


def test_a_finding_fa4s_own_jit_does_not_reproduce_is_ours_and_no_known_bad_entry(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each failing check runs again through FA4's own JIT (the oracle workers): a failure the JIT reproduces is
    FA4's, one it does not is fa4-aot's own defect."""
    _scripted_pool(monkeypatch)
    run = driver._Run(SimpleNamespace(root=tmp_path), SimpleNamespace(name="h100-sxm"),  # type: ignore[arg-type]
                      driver.Options(gpus=(0,)), {}, 3, None, lambda: False)
    run.all([("o", _check("ours", "a")), ("f", _check("fa4", "b")), ("p", _check("pass", "c"))])
    origins = run.oracle(list(run.found.values()))
    assert {i: origin for i, (origin, _said) in origins.items()} == {"o": "ours", "f": "fa4"}
    assert "dk 4.12" in origins["f"][1]
