"""A kernel `fa4-aot build --sku b200 --family tirx` stored, through NumSim (tirx-harness's numerical GPU model, on
this CPU host, in .venv-numsim): the TIR simulated compiles to exactly the stored bytes, and NumSim's output of it
matches the float32 reference within FA4's bound, which a perturbed output fails.

NumSim transpiles the kernel to Rust and links it to its engine, which cargo builds with pyo3 from crates.io: on a
host that cannot reach crates.io the numerical test is skipped with NumSim's own words, after checking that the
frontend accepted the kernel (it stopped at the engine's build, not at a TIR form it does not model). The
smallest problem the port traces, one head of 128 tokens; longer shapes and the two-SKU comparison are
bench/tirx_numsim.py's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fa4_aot.domain.sku_table import table
from fa4_aot.errors import BuildError
from fa4_aot.store import Entry, Store
from fa4_aot.tirx import simulation
from fa4_aot.tirx.loading import find
from fa4_aot.tirx.numerics import check
from fa4_aot.tirx.problem import Problem, schedule

pytestmark = pytest.mark.slow
VARIANTS = Path(__file__).resolve().parent / "numsim_variants.toml"
B200 = table(VARIANTS)["b200"]
PROBLEM = Problem.parse("b1-q128-k128-h1-kv1-d128-full")


@pytest.fixture(scope="module")
def stored(tirx_build: Callable[[Path, str], tuple[Path, list[dict]]]) -> Entry:
    """The index entry of PROBLEM's kernel in a store `fa4-aot build --sku b200 --family tirx` made."""
    try:
        simulation.python()
    except BuildError as e:
        pytest.skip(str(e))
    root, docs = tirx_build(VARIANTS, "b200")
    assert [(d["sku"], d["built"], d["failed"]) for d in docs] == [("b200", 1, [])]
    return find(Store(root), PROBLEM, B200, B200.constants())


@pytest.fixture(scope="module")
def simulated(stored: Entry) -> simulation.Simulation:
    return simulation.run(stored, schedule(PROBLEM, B200.constants()), simulation.inputs(PROBLEM))


def test_the_simulated_tir_compiles_to_the_stored_kernel(stored: Entry, simulated: simulation.Simulation) -> None:
    assert simulated.rebuilt_digest == stored.object_digest


def test_numsim_output_matches_the_fp32_reference(simulated: simulation.Simulation) -> None:
    if simulated.blocked is not None:
        # the frontend emitted the kernel's Rust: only building NumSim's engine stopped it
        assert simulated.blocked["stage"] == "engine", simulated.blocked
        lines = [line.strip() for line in simulated.blocked["error"].splitlines() if line.strip()]
        cause = " ... ".join([*(line for line in lines if line.startswith("error:"))][:1] + lines[-1:])
        pytest.skip(f"NumSim accepted the kernel but could not build its Rust engine (cargo): {cause}")
    assert simulated.check is not None and simulated.output is not None
    assert simulated.check.ok, simulated.check
    q, k, v = (simulation.inputs(PROBLEM)[name] for name in ("q", "k", "v"))
    wrong = simulated.output.copy()
    wrong[0, 37, 0, 5] += np.float16(1 / 128)
    assert not check(wrong, q, k, v, PROBLEM.causal).ok
    assert not check(simulated.output, q, k, v, not PROBLEM.causal).ok  # the causal variant's reference
