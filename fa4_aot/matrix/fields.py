"""The field checks that the tables of a variants file share: integer lists and choices from a fixed set,
each failing with a ConfigError that names file, line, field and what is allowed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..domain.tomlsrc import TomlSource
from ..errors import ConfigError

# fail(field, message): a ConfigError located at one [[variants]] entry (or its `field`); the caller raises it
Fail = Callable[[str | None, str], ConfigError]


def entry_fail(src: TomlSource, i: int) -> Fail:
    """fail() for the `i`-th [[variants]] entry of `src`."""
    def fail(field: str | None, msg: str) -> ConfigError:
        return src.fail("[[variants]]", field, msg, i)
    return fail


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_list(src: TomlSource, header: str, field: str, value: Any, index: int = 0,
             minimum: int = 1) -> tuple[int, ...]:
    """`value` as a non-empty tuple of integers >= `minimum`."""
    if not isinstance(value, list) or not value or not all(is_int(v) for v in value):
        raise src.fail(header, field, f"expected a non-empty list of integers, got {value!r}", index)
    if any(v < minimum for v in value):
        raise src.fail(header, field, f"values must be >= {minimum}, got {value!r}", index)
    return tuple(value)


def choices(src: TomlSource, i: int, field: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """`value` of the `i`-th [[variants]] entry as a non-empty tuple of names from `allowed`."""
    if not isinstance(value, list) or not value or any(v not in allowed for v in value):
        raise src.fail("[[variants]]", field, f"got {value!r}; allowed values: {', '.join(allowed)}", i)
    return tuple(value)
