"""variants.toml: the default file loads, Variant.calls() expands as documented, and every malformed entry
is a ConfigError naming file:line, the field and the allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa4_aot.domain.skus import Sku
from fa4_aot.errors import ConfigError, UnknownSku
from fa4_aot.matrix import variants
from tests.conftest import assert_located

ROOT = Path(__file__).resolve().parents[2]
H200 = Sku("h200", "sm_90a", 132, 62914560, 13)
B200 = Sku("b200", "sm_100a", 148, 132644864, 13)

GRIDS = """\
[shapes.square]
batch = [1]
seqlen_q = [128, 256]
heads = [8, 16]

[shapes.grid]
batch = [1, 2]
seqlen_q = [128, 1024]
seqlen_k = [128, 512, 2048]
heads = [8]
page_size = 64
"""


def load(tmp_path: Path, text: str) -> variants.Matrix:
    path = tmp_path / "variants.toml"
    path.write_text(text)
    return variants.load(path)


def test_default_file_loads() -> None:
    matrix = variants.load(ROOT / "variants.toml")
    assert {"h100-sxm", "h200", "b200"} <= set(matrix.skus)
    assert matrix.variants and all(v.complete or v.shapes in matrix.shapes for v in matrix.variants)
    assert all(v.signatures() if v.complete else v.calls(matrix.shapes[v.shapes]) for v in matrix.variants)


@pytest.mark.parametrize(
    ("body", "grid", "count"),
    [
        # 2 passes x 2 head dims x 2 dtypes x 2 masks x 2 gqa = 32 per point; 1 x 2 x 2 = 4 points
        ('passes = ["fwd", "bwd"]\nhead_dims = [64, [192, 128]]\ndtypes = ["bf16", "fp16"]\n'
         'masks = ["causal", "full"]\ngqa = [1, 8]', "square", 128),
        # seqlen_k < seqlen_q skipped: (128,128) (128,512) (128,2048) (1024,2048) x batch 2 = 8 points
        ('passes = ["fwd"]\nhead_dims = [128]', "grid", 8),
        # no paged backward: fwd x {dense, paged} + bwd x {dense} = 3 per point
        ('passes = ["fwd", "bwd"]\nhead_dims = [128]\nlayouts = ["dense", "paged"]', "grid", 24),
        ('passes = ["bwd", "bwd_det"]\nhead_dims = [128]\nlayouts = ["paged"]', "grid", 0),
        # duplicates in a list collapse
        ('passes = ["fwd", "fwd"]\nhead_dims = [128, 128]\ndtypes = ["bf16", "bf16"]', "square", 4),
        ('passes = ["fwd_lse"]\nhead_dims = [64]\nsoftcap = [0.0, 30]\nsink = [false, true]\nnum_splits = [1, 0, 3]',
         "square", 48),
    ],
    ids=["cartesian", "seqlen-k-below-q-skipped", "paged-fwd-only", "paged-bwd-none", "dedup", "flags"],
)
def test_calls_count(tmp_path: Path, body: str, grid: str, count: int) -> None:
    matrix = load(tmp_path, f'{GRIDS}\n[[variants]]\nname = "v"\nshapes = "{grid}"\n{body}\n')
    (variant,) = matrix.variants
    calls = variant.calls(matrix.shapes[grid])
    assert len(calls) == count
    assert len(set(calls)) == count
    assert all(c.seqlen_k >= c.seqlen_q for c in calls)
    assert all((c.page_size == 64) == (c.layout == "paged") for c in calls)
    assert not [c for c in calls if c.layout == "paged" and c.training]


def test_calls_fill_every_field(tmp_path: Path) -> None:
    matrix = load(tmp_path, f'{GRIDS}\n[[variants]]\nname = "v"\nshapes = "square"\npasses = ["bwd"]\n'
                            'head_dims = [[192, 128]]\nmasks = ["local"]\nwindow = [256, 0]\ngqa = [4]\n')
    calls = matrix.variants[0].calls(matrix.shapes["square"])
    assert {(c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv) for c in calls} == {
        (1, 128, 128, 8, 2), (1, 128, 128, 16, 4), (1, 256, 256, 8, 2), (1, 256, 256, 16, 4)}
    c = calls[0]
    assert (c.pass_, c.layout, c.dtype, c.head_dim, c.head_dim_v, c.mask, c.window) == (
        "bwd", "dense", "bf16", 192, 128, "local", (256, 0))
    assert (c.softcap, c.sink, c.num_splits, c.page_size) == (0.0, False, 1, 0)


def test_mqa_means_one_kv_head(tmp_path: Path) -> None:
    matrix = load(tmp_path, f'{GRIDS}\n[[variants]]\nname = "v"\nshapes = "square"\npasses = ["fwd"]\n'
                            'head_dims = [128]\ngqa = ["mqa", 4, 1]\n')
    calls = matrix.variants[0].calls(matrix.shapes["square"])
    assert {(c.heads_q, c.heads_kv) for c in calls} == {(8, 1), (16, 1), (8, 2), (16, 4), (8, 8), (16, 16)}


@pytest.mark.parametrize(
    ("archs", "applies"),
    [("", {"h200": True, "b200": True}), ('archs = ["sm_100a"]\n', {"h200": False, "b200": True}),
     ('archs = ["sm_90a", "sm_100a"]\n', {"h200": True, "b200": True}), ("archs = []\n", {"h200": True, "b200": True})],
    ids=["default", "blackwell-only", "both", "empty"],
)
def test_archs_filter(tmp_path: Path, archs: str, applies: dict[str, bool]) -> None:
    matrix = load(tmp_path, f'{GRIDS}\n[[variants]]\nname = "v"\nshapes = "square"\npasses = ["fwd"]\n'
                            f"head_dims = [128]\n{archs}")
    assert {s.name: matrix.variants[0].applies_to(s) for s in (H200, B200)} == applies


# -- malformed files -----------------------------------------------------------------------------
# The first [[variants]] is good; the second is built from `body`, so line lookup must find the right table.
# The line ending in `# HERE` is the one the error must name.
FIRST = '[[variants]]\nname = "ok"\nshapes = "square"\npasses = ["fwd"]\nhead_dims = [128]\n'
SECOND = '[[variants]]\nname = "v"\nshapes = "square"\npasses = ["fwd"]\nhead_dims = [128]\n'


def _second(old: str, new: str) -> str:
    return f"{GRIDS}\n{FIRST}\n" + SECOND.replace(old, new + "  # HERE")


def _case(case: str, text: str, in_message: list[str], **kw: object) -> object:
    return pytest.param(text, in_message, id=case, **kw)


BAD = [
    _case("unknown-field", _second('name = "v"', 'name = "v"\ncolour = "red"'),
          ["'colour'", "unknown field", "name, shapes, passes, head_dims, dtypes"]),
    _case("bad-pass", _second('passes = ["fwd"]', 'passes = ["fwd", "fly"]'),
          ["'passes'", "'fly'", "allowed values: fwd, fwd_lse, bwd, bwd_det"]),
    _case("passes-not-list", _second('passes = ["fwd"]', 'passes = "fwd"'), ["'passes'", "fwd, fwd_lse, bwd, bwd_det"]),
    _case("bad-dtype", _second('name = "v"', 'name = "v"\ndtypes = ["fp8"]'), ["'dtypes'", "'fp8'", "bf16, fp16"]),
    _case("bad-mask", _second('name = "v"', 'name = "v"\nmasks = ["sliding"]'),
          ["'masks'", "'sliding'", "full, causal, local"]),
    _case("bad-layout", _second('name = "v"', 'name = "v"\nlayouts = ["ragged"]'),
          ["'layouts'", "'ragged'", "dense, varlen, seqused, paged"]),
    _case("head-dim-string", _second("head_dims = [128]", 'head_dims = [64, "128"]'),
          ["'head_dims'", "'128'", "64, 96, 128, 192, 256", "[192, 128]"]),
    _case("head-dim-triple", _second("head_dims = [128]", "head_dims = [[192, 128, 64]]"),
          ["'head_dims'", "[192, 128, 64]", "64, 96, 128"]),
    _case("head-dim-not-multiple-of-8", _second("head_dims = [128]", "head_dims = [60]"),
          ["'head_dims'", "60", "multiples of 8"]),
    _case("gqa-not-dividing", _second('name = "v"', 'name = "v"\ngqa = [1, 3]'),
          ["'gqa'", "ratio 3", "[8, 16]", "'square'"]),
    _case("gqa-bad-ratio", _second('name = "v"', 'name = "v"\ngqa = [0]'), ["'gqa'", "positive integers", "mqa"]),
    _case("unknown-shapes", _second('shapes = "square"', 'shapes = "huge"'),
          ["'shapes'", "'huge'", "defined: square, grid"]),
    _case("duplicate-name", _second('name = "v"', 'name = "ok"'), ["'name'", "duplicate", "'ok'"]),
    _case("missing-head-dims", f"{GRIDS}\n{FIRST}\n[[variants]]  # HERE\nname = \"v\"\nshapes = \"square\"\n"
          'passes = ["fwd"]\n', ["#2", "missing field 'head_dims'"]),
    _case("window-one-number", _second('name = "v"', 'name = "v"\nwindow = [128]'),
          ["'window'", "[left, right]", "non-negative"]),
    _case("window-negative", _second('name = "v"', 'name = "v"\nwindow = [-1, 0]'), ["'window'", "[left, right]"]),
    _case("negative-softcap", _second('name = "v"', 'name = "v"\nsoftcap = [-1.0]'), ["'softcap'", "non-negative"]),
    _case("sink-not-bool", _second('name = "v"', 'name = "v"\nsink = ["yes"]'), ["'sink'", "true/false"]),
    _case("negative-splits", _second('name = "v"', 'name = "v"\nnum_splits = [-1]'), ["'num_splits'", ">= 0"]),
    _case("bad-arch", _second('name = "v"', 'name = "v"\narchs = ["sm_80a"]'),
          ["'archs'", "sm_90a, sm_100a, sm_103a, sm_110a, sm_120a"]),
    _case("shapes-unknown-field", GRIDS.replace("page_size = 64", "page_size = 64\nrows = [1]  # HERE"),
          ["'rows'", "batch, seqlen_q, seqlen_k, heads, page_size"]),
    _case("shapes-missing-heads", GRIDS.replace("[shapes.grid]", "[shapes.grid]  # HERE").replace(
          "heads = [8]\n", ""), ["missing field 'heads'"]),
    _case("shapes-empty-batch", GRIDS.replace("batch = [1, 2]", "batch = []  # HERE"),
          ["'batch'", "non-empty list of integers"]),
    _case("shapes-zero-seqlen", GRIDS.replace("seqlen_k = [128, 512, 2048]", "seqlen_k = [0, 512]  # HERE"),
          ["'seqlen_k'", ">= 1"]),
    _case("shapes-bad-page-size", GRIDS.replace("page_size = 64", "page_size = 0  # HERE"),
          ["'page_size'", "positive integer"]),
    _case("shapes-as-list", _second('shapes = "square"', 'shapes = ["square"]'), ["'shapes'", "square"]),
]


@pytest.mark.bad_input("variants.toml")
@pytest.mark.parametrize(("text", "in_message"), BAD)
def test_bad_entries_name_file_line_field_and_allowed_values(tmp_path: Path, text: str, in_message: list[str]) -> None:
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.endswith("# HERE"))
    path = tmp_path / "variants.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        variants.load(path)
    assert_located(e.value, path, line, in_message)


def test_good_base_of_bad_table_loads(tmp_path: Path) -> None:
    matrix = load(tmp_path, f"{GRIDS}\n{FIRST}\n{SECOND}")
    assert [v.name for v in matrix.variants] == ["ok", "v"]


NOT_TOML = f'{GRIDS}\n[[variants]]\nname = "v"\npasses = [fwd]\n'  # a bare word
NOT_TOML_LINE = NOT_TOML.splitlines().index("passes = [fwd]") + 1


@pytest.mark.bad_input("variants.toml")
def test_not_toml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "variants.toml"
    path.write_text(NOT_TOML)
    with pytest.raises(ConfigError) as e:
        variants.load(path)
    assert str(path) in str(e.value) and f"line {NOT_TOML_LINE}," in str(e.value) and "not valid TOML" in str(e.value)


def test_not_toml_uses_file_colon_line(tmp_path: Path) -> None:
    path = tmp_path / "variants.toml"
    path.write_text(NOT_TOML)
    with pytest.raises(ConfigError, match=f"^{path}:{NOT_TOML_LINE}: "):
        variants.load(path)


@pytest.mark.bad_input("variants.toml")
def test_unknown_top_level_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown top-level key 'model'; allowed: skus, shapes, variants"):
        load(tmp_path, GRIDS + '\n[model]\nname = "x"\n')


@pytest.mark.bad_input("variants.toml")
def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read .*nope.toml"):
        variants.load(tmp_path / "nope.toml")


def test_select_and_sku(tmp_path: Path) -> None:
    sku = '[skus.h200]\narch = "sm_90a"\nsm_count = 132\nl2_bytes = 62914560\ncuda_major = 13\n'
    matrix = load(tmp_path, f"{sku}\n{GRIDS}\n{FIRST}\n{SECOND}")
    assert [v.name for v in matrix.select(None)] == ["ok", "v"]
    assert [v.name for v in matrix.select(["v"])] == ["v"]
    with pytest.raises(ConfigError) as e:
        matrix.select(["v", "nope", "other"])
    assert "nope, other" in str(e.value) and str(matrix.path) in str(e.value) and "known: ok, v" in str(e.value)
    assert matrix.sku("h200").sm_count == 132
    with pytest.raises(UnknownSku, match="unknown SKU 'b200'; .*known: h200"):
        matrix.sku("b200")


COMPLETE = '[[variants]]\nname = "c"\npasses = ["fwd", "bwd"]\nhead_dims = [128]\nheads = [32, 40]\ngqa = [1, 8]\n'


def test_a_variant_without_shapes_is_shape_complete(tmp_path: Path) -> None:
    matrix = load(tmp_path, COMPLETE + 'layouts = ["dense", "paged"]\npage_size = 64\n')
    variant = matrix.variants[0]
    assert variant.complete and variant.shapes == "" and variant.heads == (32, 40)
    sigs = variant.signatures()
    # (fwd dense, fwd paged, bwd dense) x heads 32, 40 x gqa 1, 8
    assert len(sigs) == 12
    assert {(s.heads_q, s.heads_kv) for s in sigs} == {(32, 32), (32, 4), (40, 40), (40, 5)}
    assert {s.page_size for s in sigs if s.layout == "paged"} == {64}
    assert all(s.page_size == 0 for s in sigs if s.layout != "paged")


def test_a_shape_complete_variant_by_kv_heads_runs_every_ratio_on_them(tmp_path: Path) -> None:
    variant = load(tmp_path, COMPLETE.replace("heads = [32, 40]", "heads_kv = [1, 8]").replace(
        "gqa = [1, 8]", "gqa = [3, 11, 16]")).variants[0]
    assert variant.heads == () and variant.heads_kv == (1, 8)
    sigs = variant.signatures()
    assert {(s.heads_q, s.heads_kv) for s in sigs} == {(3, 1), (11, 1), (16, 1), (24, 8), (88, 8), (128, 8)}
    assert len(sigs) == 12  # (fwd, bwd) x 6 head counts


@pytest.mark.parametrize(("case", "text", "parts"), [
    ("complete-missing-heads", COMPLETE.replace("heads = [32, 40]\n", ""), ["needs one of field 'heads'",
                                                                            "'heads_kv'", "shapes ="]),
    ("complete-heads-and-kv", COMPLETE.replace("heads = [32, 40]", "heads = [32, 40]\nheads_kv = [8]"),
     ["'heads'", "'heads_kv'", "not both"]),
    ("complete-bad-kv-heads", COMPLETE.replace("heads = [32, 40]", "heads_kv = [0]  # HERE"), ["'heads_kv'", "[0]"]),
    ("complete-kv-heads-mqa", COMPLETE.replace("heads = [32, 40]", "heads_kv = [8]").replace(
        "gqa = [1, 8]", "gqa = [1, \"mqa\"]  # HERE"), ["'gqa'", "\"mqa\" needs the query head counts"]),
    ("complete-bad-heads", COMPLETE.replace("heads = [32, 40]", "heads = [0]  # HERE"), ["'heads'", "[0]"]),
    ("complete-gqa-not-dividing", COMPLETE.replace("gqa = [1, 8]", "gqa = [3]  # HERE"),
     ["'gqa'", "ratio 3 does not divide heads [32, 40]"]),
    ("grid-with-heads", f'{GRIDS}\n[[variants]]\nname = "v"\nshapes = "square"\npasses = ["fwd"]\n'
     'head_dims = [128]\nheads = [8]  # HERE\n', ["'heads'", "comes from the shape grid 'square'"]),
    ("complete-bad-page-size", COMPLETE + "page_size = -1  # HERE\n", ["'page_size'", "positive integer"]),
])
def test_shape_complete_errors_are_located(tmp_path: Path, case: str, text: str, parts: list[str]) -> None:
    path = tmp_path / "variants.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        variants.load(path)
    lines = text.splitlines()
    line = next((i + 1 for i, t in enumerate(lines) if "# HERE" in t), 1)
    assert_located(info.value, path, line, parts)
