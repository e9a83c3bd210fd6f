"""Certification verdicts as values: what `fa4-aot certify` measured of one kernel on one class of device.

A device class is what a kernel's behaviour may depend on besides its bytes: the GPU (name and SM count) and the
CUDA driver and runtime versions. A verdict is one of

    pass     every check held (outputs within tolerance of an fp32 reference; deterministic kernels repeat
             bitwise; where both runtimes ran it, the lean runtime equals FA4)
    wrong    a check failed: `tensor` names the output (out, lse, dq, dk, dv, repeat, lean) and `error` and
             `bound` say by how much
    crash    the kernel raised a CUDA error (an illegal address...) or killed its worker: `detail` holds it
    hang     the kernel did not finish within the check's deadline
    refused  it was not run: the known-bad registry (domain/known_bad.py) names it

Pure: no torch, no I/O. A kernel's verdicts are kept in the store (store/side.py), listed by signed manifests
(trust/signing.py) and enforced by both runtimes (trust/certified.py).
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("pass", "wrong", "crash", "hang", "refused")
TENSORS = ("", "out", "lse", "dq", "dk", "dv", "dsink", "repeat", "lean")
# Which verdict wins when several checks of one kernel disagree: the worst one.
_SEVERITY = {"pass": 0, "refused": 1, "wrong": 2, "hang": 3, "crash": 4}
_ID = re.compile(r"([a-z0-9][a-z0-9-]*)\.(\d+)sm\.driver-([0-9.]+)\.cuda-([0-9.]+)")
MAX_DETAIL = 2000  # a verdict's detail is a message, not a log
EARLIEST = "2020-01-01T00:00:00Z"  # no verdict can predate this project
MAX_SKEW = 300  # seconds a verdict's `when` may be ahead of the clock that receives it (clocks drift)
_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


@dataclass(frozen=True)
class DeviceClass:
    """A GPU model and the CUDA versions under it: verdicts hold for exactly one."""

    name: str  # as the device reports it, slugged ('nvidia-h200')
    sm_count: int
    driver: str  # the CUDA driver's version ('13.0'), as cudaDriverGetVersion reports it
    runtime: str  # the CUDA runtime the kernels run with ('13.0', torch.version.cuda)

    def __post_init__(self) -> None:
        if not _ID.fullmatch(self.id):
            raise ValueError(f"invalid device class {self.id!r}: expected NAME.<SMs>sm.driver-X.Y.cuda-X.Y with NAME "
                             "in lowercase letters, digits and '-'")

    @property
    def id(self) -> str:
        return f"{self.name}.{self.sm_count}sm.driver-{self.driver}.cuda-{self.runtime}"

    def __str__(self) -> str:
        return self.id

    @classmethod
    def parse(cls, text: str) -> DeviceClass:
        """Inverse of str(); ValueError naming the expected form."""
        m = _ID.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise ValueError(f"invalid device class {text!r}: expected NAME.<SMs>sm.driver-X.Y.cuda-X.Y, e.g. "
                             "nvidia-h200.132sm.driver-13.0.cuda-13.0")
        return cls(m[1], int(m[2]), m[3], m[4])

    @classmethod
    def of(cls, gpu_name: str, sm_count: int, driver_version: int, runtime: str) -> DeviceClass:
        """From what CUDA reports: the device name, its SM count, cudaDriverGetVersion's integer (13000 ->
        '13.0') and the runtime version string."""
        slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"
        return cls(slug, int(sm_count), f"{driver_version // 1000}.{driver_version % 1000 // 10}", runtime)

    def same_gpu(self, other: DeviceClass) -> bool:
        return (self.name, self.sm_count) == (other.name, other.sm_count)


@dataclass(frozen=True)
class Verdict:
    """What certification found of kernel `kernel_key` on `device`."""

    kernel_key: str
    device: str  # a DeviceClass id
    status: str
    detail: str = ""  # the failing check, the error, or the registry entry: one line for people
    tensor: str = ""  # for `wrong`: which output failed
    error: float | None = None  # for `wrong`: the largest error measured ...
    bound: float | None = None  # ... and the tolerance it exceeded
    checks: int = 0  # how many calls exercised the kernel
    calls: list[str] = field(default_factory=list)  # Call.describe() of the failing (or first few) calls
    toolchain: str = ""  # flash-attn-4 and nvidia-cutlass-dsl versions the run used ('4.0.0b36/4.8.1')
    when: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-f]{64}", str(self.kernel_key)):
            raise ValueError(f"invalid verdict: kernel key {str(self.kernel_key)[:80]!r} is not 64 hex digits")
        DeviceClass.parse(self.device)
        if self.status not in STATUSES:
            raise ValueError(f"invalid verdict status {self.status!r}: expected one of {', '.join(STATUSES)}")
        if self.tensor not in TENSORS:
            raise ValueError(f"invalid verdict tensor {self.tensor!r}: expected one of {', '.join(TENSORS[1:])}")
        for name in ("error", "bound"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, int | float):
                raise ValueError(f"invalid verdict {name} {value!r}: expected a number")
        if not isinstance(self.detail, str) or len(self.detail) > MAX_DETAIL:
            raise ValueError(f"invalid verdict detail: expected a string of at most {MAX_DETAIL} characters")

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def describe(self) -> str:
        """One line: the status and why, for errors and listings."""
        if self.status == "wrong" and self.tensor:
            how = f"{self.tensor} off by {self.error:.3g} (tolerance {self.bound:.3g})" \
                if self.error is not None and self.bound is not None else self.tensor
            return f"wrong: {how}" + (f"; {self.detail}" if self.detail else "")
        return f"{self.status}: {self.detail}" if self.detail else self.status

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Verdict:
        """Inverse of to_dict; ValueError naming a missing, unknown or invalid field."""
        if not isinstance(data, dict):
            raise ValueError(f"invalid verdict {str(data)[:80]!r}: expected an object")
        names = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - names)
        missing = [n for n in ("kernel_key", "device", "status") if n not in data]
        if unknown or missing:
            raise ValueError(f"invalid verdict: missing {missing or 'nothing'}, unknown {unknown or 'nothing'}")
        calls = data.get("calls", [])
        if not isinstance(calls, list) or not all(isinstance(c, str) for c in calls):
            raise ValueError("invalid verdict calls: expected a list of strings")
        return cls(**data)


def utc_now(now: float | None = None) -> str:
    """`now` (default: this host's clock) as a verdict's `when` is written."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))


def check_when(when: object, now: float | None = None) -> str:
    """`when` if it can be a measurement's time on a clock reading `now`; ValueError naming why not: not a UTC
    time string, not a date, before EARLIEST, or more than MAX_SKEW seconds ahead of `now` (a `when` is the
    publisher's word, and one dated ahead would outrank every later measurement)."""
    if not isinstance(when, str) or not _UTC.fullmatch(when):
        raise ValueError(f"invalid verdict time {str(when)[:40]!r}: expected a string, a UTC time like "
                         "2026-12-03T10:00:00Z")
    try:
        stamp = calendar.timegm(time.strptime(when, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        raise ValueError(f"invalid verdict time {when!r}: not a date") from None
    if when < EARLIEST:
        raise ValueError(f"invalid verdict time {when!r}: before {EARLIEST}, earlier than any measurement")
    clock = time.time() if now is None else now
    if stamp > clock + MAX_SKEW:
        raise ValueError(f"invalid verdict time {when!r}: in the future (this clock reads {utc_now(clock)}, at most "
                         f"{MAX_SKEW} s of skew allowed); fix the certifier's clock and certify again")
    return when


def worst(verdicts: list[Verdict]) -> Verdict:
    """The verdict that stands for several checks of one kernel on one device class: the most severe, with the
    number of checks summed. ValueError for an empty list."""
    if not verdicts:
        raise ValueError("no verdicts to combine")
    top = max(verdicts, key=lambda v: _SEVERITY[v.status])
    return Verdict(**{**top.to_dict(), "checks": sum(v.checks for v in verdicts)})


def severity(status: str) -> int:
    return _SEVERITY[status]


def by_device(verdicts: list[Verdict]) -> dict[str, Verdict]:
    """{device class id: verdict} of one kernel's verdicts: the newest per class (a re-certification replaces
    the verdict before it)."""
    found: dict[str, Verdict] = {}
    for v in sorted(verdicts, key=lambda v: v.when):
        found[v.device] = v
    return found
