"""Text for a terminal: what a server (or any document from outside) says is shown, never obeyed. A job's
detail, a SKU's name or an error message can hold terminal escapes (retitle the window, clear the
screen, move the cursor over earlier lines) and bidi overrides that reorder what is read. Every command prints
human text through common.emit and errors through the group's one error mapping, both of which pass it here."""

from __future__ import annotations

import re

# C0 controls but newline and tab, DEL, C1 controls, and the Unicode line separators and bidi controls
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character but newline and tab written as its escape (\\x1b, \\u202e), so it is
    seen and cannot act on the terminal."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
