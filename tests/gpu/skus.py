"""The SKU of the GPU this host has, for the GPU tests: they run on any Hopper SKU of the table (h100-sxm, h200...),
not one card's name. Asked at run time, never at collection (a host without a GPU collects and skips them)."""

from __future__ import annotations

from pathlib import Path


def present_sku(variants: Path | None = None) -> str:
    """The name of the table's row (variants.toml, or `variants`) that serves this host's GPU."""
    from fa4_aot.cli.certify_cmds import gpu_sku

    return gpu_sku(variants)[0].name
