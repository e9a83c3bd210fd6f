"""Pydantic bodies of the certify-job API (routes/certify.py): what a job looks like, what a certifier sends."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from fa4_aot.domain.verdicts import DeviceClass

from ..job_claims import ClaimId
from . import SkuName, Text
from .builds import BuilderName
from .verdicts import VerdictIn

MIN_LEASE, MAX_LEASE = 10.0, 3600.0  # seconds: a lease shorter than a renewal round trip would burn attempts
MAX_VERDICTS = 64  # a job certifies one kernel; a certifier sends one verdict per device class it ran on


def _device_class(value: str) -> str:
    DeviceClass.parse(value)  # ValueError naming the form: a 422
    return value


DeviceId = Annotated[str, Field(min_length=1, max_length=160, description="A device class id "
                                "(nvidia-h200.132sm.driver-13.0.cuda-13.0)"), AfterValidator(_device_class)]
Lease = Annotated[float, Field(default=60.0, ge=MIN_LEASE, le=MAX_LEASE, allow_inf_nan=False,
                               description="Seconds the job stays this certifier's without renewal (10 to 3600)")]


class CertifyJobOut(BaseModel):
    """A certify job. `keys` are the kernel keys it certifies (its kernel's); `verdict` is the worst verdict status
    it ended with ('' before), `verdicts` every verdict it recorded; `detail` why it failed or was queued again.
    `claim` is only in the answers to the claiming certifier (claim, lease): nobody else can finish the job."""

    id: int
    sku: str
    kernel_key: str
    keys: list[str]
    family: str
    status: Literal["queued", "running", "done", "failed"]
    attempts: int
    lapses: int
    certifier: str
    device: str
    created: datetime
    started: datetime | None
    finished: datetime | None
    lease_until: datetime | None
    detail: str
    verdict: str
    verdicts: list[dict[str, Any]]
    seconds: float
    claim: str | None = None


class CertifyClaimIn(BaseModel):
    """A certifier asks for the next job of `sku` (its GPU's SKU), to run on device class `device`."""

    model_config = ConfigDict(extra="forbid")

    certifier: str = BuilderName
    sku: SkuName
    device: DeviceId
    lease_seconds: Lease = 60.0


class CertifyLeaseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    certifier: str = BuilderName
    claim: ClaimId
    lease_seconds: Lease = 60.0


class CertifyResult(BaseModel):
    """How a certifier's job ended: done (with a verdict for each of the job's keys on its device class), failed
    (it could not certify: queued again until the job's attempts are spent), or released (the certifier stops:
    queued again, the attempt not counted)."""

    model_config = ConfigDict(extra="forbid")

    certifier: str = BuilderName
    claim: ClaimId
    status: Literal["done", "failed", "released"]
    verdicts: list[VerdictIn] = Field(default_factory=list, max_length=MAX_VERDICTS)
    detail: Text = Field(default="", max_length=16384)
    seconds: float = Field(default=0.0, ge=0.0, le=1e7, allow_inf_nan=False)
