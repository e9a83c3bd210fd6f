"""FA4_AOT_RECORD=FILE: append every distinct attention call this process makes to FILE, one JSON line per call.

The lines have the form a miss carries (Call.to_dict), so `fa4-aot coverage --calls FILE` can check a team's real
calls against any build. Safe across processes: each line is one os.write on a file opened with O_APPEND, which
POSIX makes atomic with respect to other appenders; each process writes a call once. Read at call time.
"""

from __future__ import annotations

import errno
import json
import os
import threading

from .calls import Call

_seen: set[Call] = set()
_lock = threading.Lock()


def target() -> str | None:
    """$FA4_AOT_RECORD, or None when unset."""
    return os.environ.get("FA4_AOT_RECORD") or None


def line(call: Call) -> bytes:
    return (json.dumps(call.to_dict(), sort_keys=True, separators=(",", ":")) + "\n").encode()


def note(call: Call) -> bool:
    """Append `call` to $FA4_AOT_RECORD if set and not yet written by this process. True when a line was written.
    Never raises for an unwritable file: recording must not break the call (it warns once instead)."""
    path = target()
    if path is None:
        return False
    with _lock:
        if call in _seen:
            return False
        _seen.add(call)
    try:
        # O_NOFOLLOW: a link planted at the path (a shared temp folder) must not point the appends elsewhere
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line(call))
        finally:
            os.close(fd)
    except OSError as e:
        _warn_once(path, e)
        return False
    return True


_warned: set[str] = set()


def _warn_once(path: str, error: OSError) -> None:
    import warnings

    if path not in _warned:
        _warned.add(path)
        why = "it is a symbolic link, which is never followed" if error.errno == errno.ELOOP else error.strerror
        warnings.warn(f"FA4_AOT_RECORD={path}: cannot append calls ({why}); check the path", stacklevel=3)
