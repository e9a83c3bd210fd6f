"""On the H200: every (model, TP degree) of the model suite through both runtimes, from one store: the lean runtime
(fa4_aot.flash_attn_func / flash_attn_varlen_func, which never reaches FA4) serves exactly the scenarios FA4 over
fa4_aot.install("strict") serves, and correctly (the same float32 reference, relative error below 1e-2), with no
compile on either side (issue 17, "Done when").

Same calls and tensors as tests/gpu/test_h200_models.py (its scenarios, each runtime seeded alike), over the store
bench/build_suite.sh builds; then:
python -m pytest -q -p no:cacheprovider tests/gpu/test_h200_models_lean.py
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.gpu.test_h200_models import PARAMS, SUITE, run_rank, strict  # noqa: F401  (strict: the fixture)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name,tp", PARAMS, ids=[f"{n}-tp{t}" for n, t in SUITE])
def test_model_calls_served_alike_by_both_runtimes_and_correct(strict: Any, name: str, tp: int) -> None:  # noqa: F811
    count, inst = strict
    before = count["n"]
    fa4_rank = run_rank(name, tp, "fa4")
    lean_rank = run_rank(name, tp, "lean")
    served = {r: sorted(w for w, o in rank.outcomes.items() if o == "served")
              for r, rank in (("fa4", fa4_rank), ("lean", lean_rank))}
    differ = {w: (fa4_rank.outcomes[w], lean_rank.outcomes.get(w)) for w in fa4_rank.outcomes
              if fa4_rank.outcomes[w] != lean_rank.outcomes.get(w)}
    print(f"{name} tp{tp}: FA4 served {len(served['fa4'])}, lean served {len(served['lean'])} of "
          f"{len(fa4_rank.outcomes)} scenarios")
    assert len(served["lean"]) == len(served["fa4"]) and not differ, (
        f"{name} tp{tp}: scenarios served differently (FA4, lean): {differ}")
    assert not lean_rank.failures, f"{name} tp{tp} lean ({lean_rank.hq}/{lean_rank.hkv} heads):\n" + \
        "\n".join(lean_rank.failures)
    assert not fa4_rank.failures, f"{name} tp{tp} FA4:\n" + "\n".join(fa4_rank.failures)
    assert count["n"] == before and inst.stats.compiled == 0, f"{name}: {count['n'] - before} JIT compile(s)"
