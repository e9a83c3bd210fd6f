"""Where things live, read at call time (never at import) so that tests and callers can change it."""

from __future__ import annotations

import os
import stat
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


MEMORY_FOLDERS = ("/dev/shm",)  # a tmpfs on Linux hosts and containers alike (Docker mounts one)


def link_dir() -> str:
    """Where the lean runtime makes its private, short-lived link folders (runtime/libraries.py): $FA4_AOT_LINK_DIR;
    else a folder in memory: $XDG_RUNTIME_DIR (this user's own), else /dev/shm; else the temp directory
    (tempfile.gettempdir(): $TMPDIR or /tmp). A link folder lives while a batch of kernels loads, so its making and
    removing are on every new signature's first call: 0.03 ms in memory against 0.5 ms on an ext4 /tmp
    (bench/RESULTS.md, session 18). A folder in memory is used only if no other user can replace what this process
    makes in it (safe_parent); ValueError names the fix for a $FA4_AOT_LINK_DIR that is not such a folder (the lean
    runtime raises it as ConfigError: config imports nothing of fa4_aot)."""
    import tempfile

    env = os.environ.get("FA4_AOT_LINK_DIR")
    if env:
        if not safe_parent(env):
            raise ValueError(f"FA4_AOT_LINK_DIR={env} is not a folder this process can write in which no other user "
                              "can rename or remove what it makes (owned by you or root; if others may write it, "
                              "with the sticky bit, as /tmp); point it at such a folder, or unset it")
        return env
    for folder in (os.environ.get("XDG_RUNTIME_DIR", ""), *MEMORY_FOLDERS):
        if folder and safe_parent(folder):
            return folder
    return tempfile.gettempdir()


def safe_parent(folder: str) -> bool:
    """Whether `folder` is a folder this process can write and enter, owned by this user or root, that no other user
    can rename entries of: writable by nobody else, or sticky (as /tmp and /dev/shm). A private folder made in it
    (tempfile.mkdtemp: mode 0700) can then be changed by this user alone."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return (stat.S_ISDIR(st.st_mode) and st.st_uid in (os.geteuid(), 0) and os.access(folder, os.W_OK | os.X_OK)
            and (not others_write or bool(st.st_mode & stat.S_ISVTX)))


def host_arch() -> str:
    """This host's CPU architecture as lean libraries are keyed (Entry.shared_libs): x86_64 or aarch64."""
    import platform

    machine = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)
