"""cli/terminal.printable (issue 28, D44): server text is shown escaped, never obeyed by the terminal."""

from __future__ import annotations

import pytest

from fa4_aot.cli.terminal import printable

CASES = [
    ("plain text, tabs\tand\nnewlines", "plain text, tabs\tand\nnewlines"),
    ("title\x1b]0;owned\x07", "title\\x1b]0;owned\\x07"),
    ("clear\x1b[2J\rover", "clear\\x1b[2J\\rover"),
    ("csi\x9bmore\x7f", "csi\\x9bmore\\x7f"),
    ("bidi\u202eevil\u2066x\u2069", "bidi\\u202eevil\\u2066x\\u2069"),
    ("line\u2028sep", "line\\u2028sep"),
    ("unicode ok: µs, 日本, ✓", "unicode ok: µs, 日本, ✓"),
]


@pytest.mark.parametrize(("raw", "shown"), CASES)
def test_printable_escapes_controls_only(raw: str, shown: str) -> None:
    assert printable(raw) == shown
