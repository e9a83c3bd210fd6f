"""install()'s planning (prepare(), and every kernel FA4 asks the store for) refuses a call the known-bad registry
names instead of reporting a miss that no build serves: KernelRefused names the entry, its symptom and source,
in strict and fallback mode (fallback would compile and run the bad kernel). Each case runs in a fresh interpreter
on this CPU host with FA4_AOT_SKU set, as tests/client/test_cpu_host.py does."""

from __future__ import annotations

import pytest

from tests.client.test_cpu_host import pytestmark as cpu_only
from tests.client.test_cpu_host import run

pytestmark = [cpu_only, pytest.mark.slow]
TRAIN = "fa4_aot.client.prepare((2, 1024, 16, {hd}), causal=True, training=True{more})"


@pytest.mark.parametrize(("sku", "hd", "more", "env", "refused"), [
    ("h200", 72, "", {}, True),
    ("h200", 80, ", mode='fallback'", {}, True),  # fallback too: FA4 would compile and run it
    ("h200", 64, "", {}, False),
    ("b200", 72, "", {}, False),  # another arch: no entry holds
    ("h200", 72, "", {"FA4_AOT_CERTIFIED": "off"}, False),
])
def test_prepare_refuses_a_known_bad_call(tmp_path, sku: str, hd: int, more: str, env: dict[str, str],
                                          refused: bool) -> None:
    out = run(TRAIN.format(hd=hd, more=more), tmp_path, FA4_AOT_SKU=sku, **env)
    if refused:
        assert "KernelRefused" in out and "known bad (sm90-bwd-dq-hd72-80)" in out, out[-3000:]
        assert f"d={hd} causal b=2 sq=1024 sk=1024 h=16/16 on SKU h200 is refused" in out
        assert not (tmp_path / "misses").exists()  # no miss: no build serves it
    else:
        assert "KernelRefused" not in out and ("KernelMissing" in out or more), out[-3000:]


def test_a_paged_hd160_decode_is_refused_on_h200(tmp_path) -> None:
    code = ("fa4_aot.client.prepare((64, 1, 32, 160), (64, 4096, 8, 160), causal=True, layout='paged', "
            "page_size=16)")
    out = run(code, tmp_path, FA4_AOT_SKU="h200")
    assert "KernelRefused" in out and "sm90-paged-hd160-illegal-address" in out, out[-3000:]
