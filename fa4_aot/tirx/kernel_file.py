"""The store object of a TIRx kernel: its cubin and what launching it needs, in one content-addressed file.

PyPI TVM builds no CUDA runtime module, so a GPU host launches the cubin itself (cuda_driver.py) and needs what
TVM's generated host code knew: the kernel's name, its parameter order (the CUDA source declares the tensor
maps sorted by name, not in make_kernel's order), grid, block, dynamic shared memory and cluster shape. One JSON
document holds them with the cubin (base64), so the object's digest covers the launch as well as the code and
verify/sign/push/pull/serve handle it as any other object.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from ..errors import IntegrityError

FORMAT = "fa4-aot/tirx-kernel/1"


@dataclass(frozen=True)
class KernelFile:
    cubin: bytes
    function: str
    params: tuple[str, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    cluster: tuple[int, int, int]

    def to_bytes(self) -> bytes:
        doc = {"format": FORMAT, "function": self.function, "params": list(self.params), "grid": list(self.grid),
               "block": list(self.block), "shared_bytes": self.shared_bytes, "cluster": list(self.cluster),
               "cubin": base64.b64encode(self.cubin).decode()}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_launch(cls, cubin: bytes, launch: dict[str, Any]) -> KernelFile:
        return cls(cubin, launch["function"], tuple(launch["params"]), _dim3(launch["grid"]),
                   _dim3(launch["block"]), int(launch["shared_bytes"]), _dim3(launch["cluster"]))

    @classmethod
    def parse(cls, data: bytes, source: str) -> KernelFile:
        """Read an object; IntegrityError naming `source` when it is not a TIRx kernel file of this format."""
        try:
            doc = json.loads(data)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT!r}")
            return cls.from_launch(base64.b64decode(doc["cubin"], validate=True), doc)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise IntegrityError(f"{source} is not a TIRx kernel file ({e}); run `fa4-aot verify --quarantine` "
                                 "and build the kernel again (`fa4-aot build --family tirx`)",
                                 expected=FORMAT, actual=str(e), source=source) from e


def _dim3(value: Any) -> tuple[int, int, int]:
    x, y, z = (int(v) for v in value)
    return x, y, z
