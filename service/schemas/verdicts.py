"""Pydantic bodies of the verdict API (routes/verdicts.py): what a certifier publishes, what readers get back.

A verdict is fa4_aot.domain.verdicts.Verdict on the wire: every body is also rebuilt as one (VerdictIn.verdict), so
the service refuses exactly what the values refuse, with their messages, and caps what they leave open (how many
calls, how long a string) so that a verdict stays a small document."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from fa4_aot.domain.verdicts import MAX_DETAIL, Verdict, check_when

from . import Hex64, SkuName, Text

DEVICE = r"^[a-z0-9][a-z0-9-]*\.\d+sm\.driver-[0-9.]+\.cuda-[0-9.]+$"
UTC_TIME = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"
MAX_CALLS = 100  # Call.describe() lines of the failing (or first few) calls
MAX_CALL_CHARS = 2000
MAX_PER_REQUEST = 1000
Status = Literal["pass", "wrong", "crash", "hang", "refused"]
Tensor = Literal["", "out", "lse", "dq", "dk", "dv", "dsink", "repeat", "lean"]
DeviceId = Annotated[str, Field(pattern=DEVICE, max_length=160, description="A device class id, e.g. "
                                "nvidia-h200.132sm.driver-13.0.cuda-13.0")]
# The publisher's word, so checked against the server's clock (a date, not before 2020, not ahead by more than a
# few minutes) and never trusted to order verdicts past the time the server received them (crud/verdicts.py).
Measured = Annotated[str, Field(pattern=UTC_TIME, description="When it was measured (UTC), e.g. 2026-12-03T03:04:11Z; "
                                "a date from 2020 on, at most 5 minutes ahead of the server's clock"),
                     AfterValidator(check_when)]
Number = Annotated[float, Field(allow_inf_nan=False)]


class VerdictIn(BaseModel):
    """One verdict as `fa4-aot certify` keeps it (Verdict.to_dict()). The newest measurement of a kernel and
    device class wins, its time being its `when` or, when that is later, the time the server received it: an
    older one is kept out, not an error."""

    model_config = ConfigDict(extra="forbid", strict=True)  # a count is a number, not "12"

    kernel_key: Hex64
    device: DeviceId
    status: Status
    detail: Text = Field(default="", max_length=MAX_DETAIL)
    tensor: Tensor = ""
    error: Number | None = None
    bound: Number | None = None
    checks: int = Field(default=0, ge=0, lt=1 << 31)
    calls: list[Annotated[Text, Field(max_length=MAX_CALL_CHARS)]] = Field(default_factory=list,
                                                                          max_length=MAX_CALLS)
    toolchain: Text = Field(default="", max_length=256)
    when: Measured

    @model_validator(mode="after")
    def _is_a_verdict(self) -> VerdictIn:
        self.verdict()  # ValueError (a 422) for anything Verdict refuses
        return self

    def verdict(self) -> Verdict:
        return Verdict.from_dict(self.model_dump(include=set(VerdictIn.model_fields)))


class VerdictOut(VerdictIn):
    """A verdict the service holds, with the SKU of its kernel and when the service recorded it."""

    when: Annotated[str, Field(pattern=UTC_TIME)]  # checked when it came in, not against today's clock

    sku: SkuName
    publisher: str
    recorded: datetime


class VerdictsStored(BaseModel):
    """The answer to a publish: how many verdicts were stored (new, or newer than the one held) and how many
    were not (the service already held them, or a newer one of that kernel and device class)."""

    stored: int
    kept: int
