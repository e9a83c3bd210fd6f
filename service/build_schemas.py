"""Pydantic bodies of the build API (routes/builds.py): what a job looks like, what a builder sends."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

BuilderName = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")


class BuildOut(BaseModel):
    """A build job. `kernel_key` is the missed key (a kernel's, or a lean call's: family "recipe"); `detail`
    says why a job failed or was rejected (FA4's own reason), or what a done job published."""

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


class MissAnswer(BaseModel):
    """The answer to a miss report: the job that builds it, or why none was queued."""

    build: BuildOut | None
    detail: str = ""


class ClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    builder: str = BuilderName
    lease_seconds: float = Field(default=60.0, ge=1.0, le=3600.0)


class BuildResult(BaseModel):
    """How a builder's job ended."""

    model_config = ConfigDict(extra="forbid")

    builder: str = BuilderName
    status: Literal["done", "failed", "rejected"]
    detail: str = Field(default="", max_length=16384)
    compile_seconds: float = Field(default=0.0, ge=0.0, le=1e7, allow_inf_nan=False)
    built: int = Field(default=0, ge=0, lt=1 << 31)
