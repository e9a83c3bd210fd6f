"""[[tirx]] entries of a variants file (explicit problems, catalog training shapes), and a strict load's miss."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa4_aot.domain.skus import Sku
from fa4_aot.errors import ConfigError, KernelMissing
from fa4_aot.matrix import variants
from fa4_aot.store import Store
from fa4_aot.tirx import entries
from fa4_aot.tirx.loading import find, problem_of
from fa4_aot.tirx.problem import FAMILY, Problem

B200 = Sku("b200", "sm_100a", 148, 132644864, 13)
HEAD = '[skus.b200]\narch = "sm_100a"\nsm_count = 148\nl2_bytes = 132644864\ncuda_major = 13\n'


def _file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "variants.toml"
    path.write_text(HEAD + body)
    return path


def test_models_give_their_training_shapes_per_tp(tmp_path: Path) -> None:
    path = _file(tmp_path, '[[tirx]]\nname = "t"\nmodels = ["llama-3.1-8b", "llama-3.2-1b"]\ntp = [1, 8]\n'
                           'batch = [2]\nseqlens = [4096]\n')
    [entry] = entries.load(path)
    assert [str(p) for p in entry.problems] == [
        "b2-q4096-k4096-h32-kv8-d128-causal", "b2-q4096-k4096-h4-kv1-d128-causal"]
    assert entry.skipped == ("llama-3.2-1b tp1: head dim 64/64, not 128", "llama-3.2-1b tp8: head dim 64/64, not 128")
    variants.load(path)  # the FA4 matrix reads the same file and leaves [[tirx]] to this family


@pytest.mark.parametrize(("body", "line", "why"), [
    ('[[tirx]]\nname = "t"\nproblems = ["b1-q256-k256-h4-kv4-d64-full"]\n', 6, "head dim 64"),
    ('[[tirx]]\nname = "t"\nproblems = []\nmodels = ["llama-3.1-8b"]\n', 6, "exactly one of problems and models"),
    ('[[tirx]]\nname = "t"\nproblem = ["b1-q256-k256-h4-kv4-d128-full"]\n', 8, "unknown field"),
])
def test_bad_entries_name_file_line_and_why(tmp_path: Path, body: str, line: int, why: str) -> None:
    path = _file(tmp_path, body)
    with pytest.raises(ConfigError, match=why) as e:
        entries.load(path)
    assert str(e.value).startswith(f"{path}:{line}"), str(e.value)


def test_select_names_what_is_known(tmp_path: Path) -> None:
    path = _file(tmp_path, '[[tirx]]\nname = "t"\nproblems = ["b1-q256-k256-h4-kv4-d128-full"]\n')
    with pytest.raises(ConfigError, match="known: t"):
        entries.select(entries.load(path), ["u"], path)


def test_a_problem_not_built_is_kernel_missing_with_the_build_command(tmp_path: Path) -> None:
    problem = problem_of((1, 256, 4, 128), None, causal=False)
    assert problem == Problem.parse("b1-q256-k256-h4-kv4-d128-full")
    with pytest.raises(KernelMissing, match=r"fa4-aot build --sku b200 --family tirx") as e:
        find(Store(tmp_path / "store"), problem, B200, B200.constants())
    assert e.value.family == FAMILY and e.value.sku == "b200"


def test_load_takes_only_known_families() -> None:
    import fa4_aot

    with pytest.raises(ValueError, match="family='fa4' or 'tirx'"):
        fa4_aot.load((1, 256, 4, 128), family="triton")


def test_build_family_tirx_refuses_fa4_options_and_other_archs(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    variants_file = str(Path(__file__).resolve().parents[1] / "data" / "tirx_variants.toml")
    dry = run_cli("build", "--sku", "b200", "--family", "tirx", "--variants", variants_file, "--dry-run",
                  cache=tmp_path)
    assert dry.returncode == 2 and "--dry-run belong to FA4's builds" in dry.stderr, dry.stderr
    other = run_cli("build", "--sku", "h200", "--family", "tirx", "--variants", variants_file, cache=tmp_path)
    assert other.returncode == 1 and "SKU h200 is sm_90a" in other.stderr, other.stderr
