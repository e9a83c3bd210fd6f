"""Prometheus metrics of one app: a private registry (two apps in a process never share counters) and the
ASGI middleware that counts requests by route template, status and bytes sent."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class Metrics:
    """The app's metric objects, registered in their own CollectorRegistry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("fa4_aot_http_requests", "HTTP requests by method, route template and status",
                                ["method", "route", "status"], registry=self.registry)
        self.bytes_sent = Counter("fa4_aot_http_response_bytes", "Response body bytes sent, by route template",
                                  ["route"], registry=self.registry)
        self.latency = Histogram("fa4_aot_http_request_duration_seconds", "Request latency by route template",
                                 ["route"], registry=self.registry,
                                 buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60))
        self.objects = Gauge("fa4_aot_objects", "Objects held", registry=self.registry)
        self.kernels = Gauge("fa4_aot_kernels", "Kernels held", registry=self.registry)
        self.misses = Gauge("fa4_aot_misses", "Distinct kernels reported missing", registry=self.registry)
        self.signed_manifests = Gauge("fa4_aot_signed_manifests", "Signed manifests held", registry=self.registry)
        self.revocations = Gauge("fa4_aot_revocations", "Revoked keys and manifests", registry=self.registry)
        self.verdicts = Gauge("fa4_aot_verdicts", "Certification verdicts held (one per kernel and device class), by "
                              "status", ["status"], registry=self.registry)
        self.build_jobs = Gauge("fa4_aot_build_jobs", "Build jobs by status (queued and running: the queue depth)",
                                ["status"], registry=self.registry)
        self.build_compile = Histogram("fa4_aot_build_compile_seconds", "CPU seconds a build job's compiles took, "
                                       "per finished job", registry=self.registry, buckets=_BUILD_BUCKETS)
        self.certify_jobs = Gauge("fa4_aot_certify_jobs", "Certify jobs by status (queued and running: the queue "
                                  "depth)", ["status"], registry=self.registry)
        self.certify_seconds = Histogram("fa4_aot_certify_seconds", "Seconds a certifier took on a certify job, per "
                                         "finished job", registry=self.registry, buckets=_BUILD_BUCKETS)
        self.certify_ended = Counter("fa4_aot_certify_jobs_ended", "Certify jobs that ended, by verdict (pass, wrong, "
                                     "crash, hang, refused; none: failed without one)", ["verdict"],
                                     registry=self.registry)
        self.bundle_bytes = Gauge("fa4_aot_bundle_bytes_in_flight", "Bundle bytes this worker is sending now, of "
                                  "its FA4_AOT_BUNDLE_BYTES_IN_FLIGHT (past it, bundle requests get 503)",
                                  registry=self.registry)
        self.miss_to_publish = Histogram("fa4_aot_build_miss_to_publish_seconds", "Seconds from a miss's first "
                                         "report to its job's kernels published, per done job",
                                         registry=self.registry, buckets=_BUILD_BUCKETS)

    def set_counts(self, counts: dict[str, int]) -> None:
        self.objects.set(counts["objects"])
        self.kernels.set(counts["kernels"])
        self.misses.set(counts["misses"])
        self.signed_manifests.set(counts["signed_manifests"])
        self.revocations.set(counts["revocations"])

    def set_verdicts(self, by_status: dict[str, int]) -> None:
        for status, n in by_status.items():
            self.verdicts.labels(status).set(n)

    def set_builds(self, depth: dict[str, int]) -> None:
        for status, n in depth.items():
            self.build_jobs.labels(status).set(n)

    def set_certify(self, depth: dict[str, int]) -> None:
        for status, n in depth.items():
            self.certify_jobs.labels(status).set(n)

    def observe_certify(self, job: Any) -> None:
        """A certify job got a result (service/crud/certify.finish): its seconds and, once it ended, its verdict."""
        self.certify_seconds.observe(job.seconds)
        if job.status in ("done", "failed"):
            self.certify_ended.labels(job.verdict or "none").inc()

    def observe_build(self, job: Any) -> None:
        """A job finished (service/crud/builds.finish): its compile seconds and, when done, miss to publish."""
        self.build_compile.observe(job.compile_seconds)
        if job.status == "done" and job.finished is not None:
            self.miss_to_publish.observe(max(0.0, (job.finished - job.created).total_seconds()))


_BUILD_BUCKETS = (1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600, 1800)


class MetricsMiddleware:
    """Pure ASGI middleware (streams pass through untouched). Unmatched paths share the label `<unmatched>`,
    so probing random URLs cannot grow the label set."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state: dict[str, Any] = {"status": 500, "sent": 0}

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body":
                state["sent"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "<unmatched>"
            self.metrics.requests.labels(scope["method"], route, str(state["status"])).inc()
            self.metrics.bytes_sent.labels(route).inc(state["sent"])
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)
