"""A parsed TOML file that can say where a table or field stands, so config errors name file and line."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from ..errors import ConfigError


class TomlSource:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            text = self.path.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read {self.path}: {e.strerror}") from e
        try:
            self.data: dict[str, Any] = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            line = re.search(r"at line (\d+)", str(e))
            where = f"{self.path}:{line.group(1)}" if line else str(self.path)
            raise ConfigError(f"{where}: not valid TOML: {e}") from e
        self.lines = text.splitlines()

    def where(self, header: str, field: str | None = None, index: int = 0) -> str:
        """'file:line' of the `index`-th table whose header is `header` (e.g. '[[variants]]', '[skus.h200]'),
        or of `field` inside it when given. Falls back to the header's line, then to the file alone."""
        header_re = re.compile(r"^\s*" + re.escape(header) + r"\s*(#.*)?$")
        starts = [i for i, line in enumerate(self.lines) if header_re.match(line)]
        if index >= len(starts):
            return str(self.path)
        start = starts[index]
        if field is not None:
            field_re = re.compile(r"^\s*" + re.escape(field) + r"\s*=")
            for i in range(start + 1, len(self.lines)):
                if self.lines[i].lstrip().startswith("["):
                    break
                if field_re.match(self.lines[i]):
                    return f"{self.path}:{i + 1}"
        return f"{self.path}:{start + 1}"

    def fail(self, header: str, field: str | None, message: str, index: int = 0) -> ConfigError:
        """A ConfigError located at `header`/`field`; the caller raises it."""
        where = self.where(header, field, index)
        what = f"field {field!r}" if field else header
        return ConfigError(f"{where}: {what}: {message}")
