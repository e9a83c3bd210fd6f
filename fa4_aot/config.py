"""Where things live, read at call time (never at import) so that tests and callers can change it."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT_DIR = PACKAGE_DIR.parent


def default_cache_dir() -> Path:
    """$FA4_AOT_CACHE, else `cache/` of the checkout fa4_aot runs from, else ~/.cache/fa4-aot."""
    env = os.environ.get("FA4_AOT_CACHE")
    if env:
        return Path(env).expanduser()
    if (CHECKOUT_DIR / "cache" / "README.md").is_file():
        return CHECKOUT_DIR / "cache"
    return Path.home() / ".cache" / "fa4-aot"


def server_url() -> str | None:
    """$FA4_AOT_SERVER, or None when it is unset or FA4_AOT_OFFLINE=1 (never touch the network)."""
    url = os.environ.get("FA4_AOT_SERVER")
    if not url or os.environ.get("FA4_AOT_OFFLINE") == "1":
        return None
    return url


def fetch_deadline() -> float:
    """$FA4_AOT_FETCH_DEADLINE: the most seconds one request or download to the server may take in all,
    retries included (default 60); a bad value falls back to the default."""
    try:
        value = float(os.environ.get("FA4_AOT_FETCH_DEADLINE", "60"))
    except ValueError:
        return 60.0
    return value if value > 0 else 60.0


def default_variants_file() -> Path:
    """$FA4_AOT_VARIANTS, else variants.toml of the checkout, else the copy shipped inside the package."""
    env = os.environ.get("FA4_AOT_VARIANTS")
    if env:
        return Path(env).expanduser()
    if (CHECKOUT_DIR / "variants.toml").is_file():
        return CHECKOUT_DIR / "variants.toml"
    return PACKAGE_DIR / "variants.toml"


def host_arch() -> str:
    """This host's CPU architecture as lean libraries are keyed (Entry.shared_libs): x86_64 or aarch64."""
    import platform

    machine = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)
