"""Certify jobs as the client sees them (service/routes/certify.py): a typed value checked before any field of it is
used, as answers.py checks the other answers. A proxy's page, a server of another version or a hostile one gives
one RemoteError naming the server, never a KeyError or TypeError that would kill a certifier or a waiting client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..domain.verdicts import Verdict
from ..errors import RemoteError
from ..store import check_hex
from .answers import AGAIN, MALFORMED, checked_verdict

STATUSES = ("queued", "running", "done", "failed")
FINAL = ("done", "failed")


@dataclass(frozen=True)
class CertifyJob:
    """One certify job: the kernel keys it certifies on a GPU of `sku`, its state, and (once it ended) its verdicts.
    `claim` is set only in the answers to the certifier that claimed it: what renews and finishes it."""

    id: int
    sku: str
    kernel_key: str
    keys: tuple[str, ...]
    family: str
    status: str
    attempts: int
    certifier: str
    device: str
    detail: str
    verdict: str
    verdicts: tuple[Verdict, ...]
    claim: str = ""

    @property
    def ended(self) -> bool:
        return self.status in FINAL

    def describe(self) -> str:
        """One line for logs and errors."""
        what = f"certify job {self.id} ({self.family} {self.kernel_key[:16]}… of {self.sku}): {self.status}"
        what += f", verdict {self.verdict}" if self.verdict else ""
        return what + (f": {self.detail}" if self.detail else "")


def job_of(doc: Any, source: str) -> CertifyJob:
    """The certify job in `doc`; RemoteError naming `source` when a field it uses is missing or of another type,
    or when one of its verdicts fails the check every verdict from a server passes (answers.checked_verdict)."""
    try:
        if not isinstance(doc, dict):
            raise TypeError(f"expected a JSON object, got {str(doc)[:80]}")
        job = CertifyJob(
            id=_count(doc["id"], "id"), sku=_text(doc["sku"], "sku"),
            kernel_key=check_hex(doc["kernel_key"], "kernel key"),
            keys=tuple(check_hex(k, "kernel key") for k in _list(doc["keys"])), family=_text(doc["family"], "family"),
            status=_status(doc["status"]), attempts=_count(doc["attempts"], "attempts"),
            certifier=_text(doc["certifier"], "certifier"), device=_text(doc["device"], "device"),
            detail=_text(doc["detail"], "detail"), verdict=_text(doc["verdict"], "verdict"),
            verdicts=tuple(checked_verdict(v) for v in _list(doc["verdicts"])),
            claim=_text(doc.get("claim") or "", "claim"))
    except (*MALFORMED, RecursionError) as e:
        raise RemoteError(f"{source} sent something that is not a certify job ({type(e).__name__}: {str(e)[:200]}); "
                          f"{AGAIN}") from None
    return job


def jobs_of(doc: Any, source: str) -> list[CertifyJob]:
    """A list of certify jobs (GET /v1/certify-jobs); RemoteError as job_of."""
    if not isinstance(doc, list):
        raise RemoteError(f"{source} sent {str(doc)[:80]}, not a list of certify jobs; {AGAIN}")
    return [job_of(item, source) for item in doc]


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
        raise ValueError(f"{what} {str(value)[:40]} is not a count")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} {str(value)[:40]} is not a string")
    return value


def _status(value: Any) -> str:
    if value not in STATUSES:
        raise ValueError(f"status {str(value)[:40]} is not one of {', '.join(STATUSES)}")
    return str(value)


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a JSON list, got {str(value)[:80]}")
    return value
