"""`fa4-aot build` options of the farm: several SKUs, the executor choice and --push, as one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import TINY_VARIANTS, run_cli


def test_push_needs_the_ray_executor(tmp_path: Path) -> None:
    result = run_cli("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--push", "http://127.0.0.1:9",
                     cache=tmp_path)
    assert result.returncode == 2 and "--push needs --executor ray" in result.stderr


def test_unknown_sku_in_a_list_is_one_line(tmp_path: Path) -> None:
    result = run_cli("build", "--sku", "h200,h300", "--variants", str(TINY_VARIANTS), cache=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "h300" in result.stderr


def test_dry_run_of_all_skus_plans_each_in_its_flavour(tmp_path: Path) -> None:
    """--sku all covers the CUDA 12 flavour too; planning runs FA4's dispatch in that flavour's environment."""
    import pytest

    from fa4_aot.compile import flavours
    from fa4_aot.errors import BuildError

    try:
        flavours.python_for(12)
    except BuildError as e:
        pytest.skip(str(e))
    result = run_cli("build", "--sku", "all", "--variants", str(TINY_VARIANTS), "--only", "full-fwd", "--dry-run",
                     "--json", cache=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    docs = json.loads(result.stdout)
    assert [d["sku"] for d in docs] == ["h200", "h200-cu12", "h100-sxm", "b200", "gh200", "gb200"]
    assert all(d["planned"] == d["kernels"] == 1 for d in docs)
    keys = {d["sku"]: d["kernel_keys"][0] for d in docs}
    # the CUDA major, the flavour and the host target are in the (base) key; SKUs of one arch, CUDA major and
    # host target share it
    assert len(set(keys.values())) == 4
    assert keys["h200"] == keys["h100-sxm"] != keys["h200-cu12"] and keys["b200"] == keys["gb200"]
    assert keys["gh200"] not in (keys["h200"], keys["h200-cu12"])
