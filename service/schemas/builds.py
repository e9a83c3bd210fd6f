"""Pydantic bodies of the build API (routes/builds.py): what a job looks like, what a builder sends."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..job_claims import ClaimId
from . import SkuName, Text

BuilderName = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")
# seconds a claim holds a job without renewal (a builder renews every third of it): shorter than a renewal round
# trip burns the job's attempts, longer keeps a dead builder's job from the others
MIN_LEASE, MAX_LEASE = 10.0, 600.0


def _lease(value: float) -> float:
    if not MIN_LEASE <= value <= MAX_LEASE:  # one message naming the whole range, not just the bound it missed
        raise ValueError(f"lease_seconds must be from {MIN_LEASE:g} to {MAX_LEASE:g} seconds, not {value:g}: the "
                         "builder renews every third of it, and a dead builder's job waits for it to run out")
    return value


Lease = Annotated[float, Field(allow_inf_nan=False, json_schema_extra={"minimum": MIN_LEASE, "maximum": MAX_LEASE},
                               description="Seconds the job stays this builder's without renewal (10 to 600)"),
                  AfterValidator(_lease)]


class BuildOut(BaseModel):
    """A build job. `kernel_key` is the missed key (a kernel's, or a lean call's: family "recipe"); `detail`
    says why a job failed, was queued again or was rejected (FA4's own reason), or what a done job published.
    `claim` is only in the answers to the claiming builder (claim, lease): nobody else can renew or finish it."""

    id: int
    sku: str
    kernel_key: str
    family: str
    status: Literal["queued", "running", "done", "failed", "rejected"]
    reports: int
    attempts: int
    builder: str
    created: datetime
    started: datetime | None
    finished: datetime | None
    lease_until: datetime | None
    detail: str
    compile_seconds: float
    built: int
    call: dict[str, Any] | None
    compile_key: Any = None  # only in a claim's answer: what the builder needs to run it
    args: dict[str, Any] | None = None
    claim: str | None = None
    not_before: datetime | None = None  # a job queued again after a failure is not claimed before


class MissAnswer(BaseModel):
    """The answer to a miss report: the job that builds it, or why none was queued."""

    build: BuildOut | None
    detail: str = ""


class ClaimIn(BaseModel):
    """A builder asks for the next job of one of `skus` (those its variants file can build; every SKU its token
    may publish when absent), leased for `lease_seconds`."""

    model_config = ConfigDict(extra="forbid")

    builder: str = BuilderName
    lease_seconds: Lease = 60.0
    skus: list[SkuName] | None = Field(default=None, min_length=1, max_length=256)


class LeaseIn(BaseModel):
    """A builder extends its claim's lease."""

    model_config = ConfigDict(extra="forbid")

    builder: str = BuilderName
    claim: ClaimId
    lease_seconds: Lease = 60.0


class BuildResult(BaseModel):
    """How a builder's claim ended: done (what the job asked for is published: the server checks), failed (a
    transient failure: queued again with a backoff while attempts remain), or rejected (FA4 refused the call:
    `detail` is FA4's reason, final)."""

    model_config = ConfigDict(extra="forbid")

    builder: str = BuilderName
    claim: ClaimId
    status: Literal["done", "failed", "rejected"]
    detail: Text = Field(default="", max_length=16384)
    compile_seconds: float = Field(default=0.0, ge=0.0, le=1e7, allow_inf_nan=False)
    built: int = Field(default=0, ge=0, lt=1 << 31)
