"""The transport to one fa4-aot server: every request within a deadline (deadline.py: connect, status line,
headers and body alike, however slowly a server drips them), retried with exponential backoff on
timeouts, connection errors and 5xx (a busy server's 503, a timeout or a dropped connection until the deadline,
waiting at least a 503's Retry-After), its body read with a cap; the server treated as down once nothing listens
there, or after DOWN_AFTER requests in a row failed for want of it; an answer's status turned into the error that
names the fix (a 401 or 403 names the token scope the route wants).

A request whose deadline runs out while the server goes on answering this process's other requests is renewed,
not failed: under a cluster's start every answer waits behind every node's requests, so how long one
takes grows with the cluster, not with the server's health; a server busy but answering is slow, not down. A
request ends without an answer only when the server answered nothing for a whole deadline (or refuses
connections), or after PATIENCE deadlines in all, which bounds a server that answers some requests and drips
others.

The typed calls stand on this (endpoints.py), the downloads and uploads on those (http.py: Remote)."""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx

from .. import config
from ..errors import RemoteAuthError, RemoteError, Unreachable
from . import deadline as deadlines
from .answers import parsed

_T = TypeVar("_T")
RETRIES = 4
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
MIN_ATTEMPT = 0.1  # seconds: with less left before the deadline, another attempt is not started
# An attempt waits at most this share of the deadline for an answer, so that a slow one (a server busy with a
# cluster's start) is tried again within the deadline rather than using all of it.
ATTEMPT_SHARE = 1 / 3
# A request is renewed (another deadline) while the server answered this process's other requests within the last
# deadline, until this many deadlines have passed since it began.
PATIENCE = 5
DOWN_AFTER = 3  # requests in a row that failed for want of the server, each after its retries: then it is down
# The most a client reads of an answer that is not an object (objects stop at their listed size): a JSON answer
# (a SKU's manifest lists every kernel, a miss page 1,000 call records). endpoints.py caps its larger answers.
MAX_JSON = 64 << 20
ENV_ADVICE = "check FA4_AOT_SERVER or set FA4_AOT_OFFLINE=1 to use the local store only"


class Transport:
    """One server, for one process start: every request and download has a deadline (retries included,
    FA4_AOT_FETCH_DEADLINE, read at call time unless `deadline` is given), renewed while the server answers
    other requests of this Transport (_renewed, at most PATIENCE deadlines in all). The server is treated as down
    (later calls fail at once) when nothing listens there, or after DOWN_AFTER requests in a row failed for want
    of it (no answer in time, 5xx, connections lost, each retried to its deadline); any answer resets that count.
    `advice` ends a "cannot reach" message: the default names the environment variables a client reads; a
    command given --server passes its own (the variables did not choose the server)."""

    def __init__(self, url: str, token: str | None = None, retries: int = RETRIES,
                 deadline: float | None = None, advice: str = ENV_ADVICE) -> None:
        if not re.match(r"https?://[^/\s]", url):
            raise RemoteError(f"server URL {url!r} needs a scheme and a host, e.g. http://{url.split('://')[-1]}")
        self.url = url.rstrip("/")
        self.retries = retries
        self.deadline = deadline
        self.advice = advice
        self.down = ""  # why the server was given up on, once it was
        self.failures = 0  # requests in a row that failed for want of the server
        self.answered_at: float | None = None  # time.monotonic() of the server's last answer to this Transport
        self._failures_lock = threading.Lock()  # install()'s fetch threads share one Transport
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT,
                                    transport=deadlines.transport())

    def close(self) -> None:
        self._client.close()

    def _whole(self) -> float:
        """The deadline of one request, in seconds: `deadline`, else FA4_AOT_FETCH_DEADLINE."""
        return self.deadline if self.deadline is not None else config.fetch_deadline()

    def _end(self) -> float:
        """When a request starting now must end: the fetch deadline from now, or sooner where the caller's own
        deadline (deadline.capped, a strict miss's wait) ends first."""
        end = time.monotonic() + self._whole()
        caller = deadlines.caller_end()
        return end if caller is None else min(end, caller)

    def _renewed(self, began: float, end: float) -> float:
        """The deadline of a request begun at `began` whose deadline `end` ran out: another whole deadline from now
        while the server answered this Transport's other requests within the last deadline (busy, not down), never
        past PATIENCE deadlines from `began` nor the caller's own deadline; else `end` (the request fails)."""
        whole, now, last = self._whole(), time.monotonic(), self.answered_at
        if remaining(end) >= MIN_ATTEMPT or last is None or now - last > whole:
            return end
        caller = deadlines.caller_end()
        renewed = min(now + whole, began + PATIENCE * whole, caller if caller is not None else float("inf"))
        return renewed if renewed - now >= MIN_ATTEMPT else end

    def _timeouts(self, end: float) -> httpx.Timeout:
        """One attempt's timeouts: within the deadline `end`, and at most ATTEMPT_SHARE of the whole deadline."""
        return timeouts(end, max(1.0, self._whole() * ATTEMPT_SHARE))

    def _check_up(self) -> None:
        if self.down:
            raise Unreachable(f"{self.url} is treated as down for the rest of this process ({self.down}); "
                              f"restart once it answers; {self.advice}")

    def _give_up(self, why: str, cause: BaseException | None = None, nobody_listens: bool = False) -> Unreachable:
        """The error for a server given up on, marked down unless the caller's own deadline (deadline.capped) is
        what ran out: a wait that ends says nothing of the fetches that follow it."""
        caller = deadlines.caller_end()
        if caller is not None and remaining(caller) < MIN_ATTEMPT:
            error = Unreachable(f"{why}; the caller's own deadline ran out first")
            error.__cause__ = cause
            return error
        self._failed(why, nobody_listens)
        # a refused connection is no slow link: more time would not help, the URL or the server is wrong
        slow = "" if nobody_listens else "raise FA4_AOT_FETCH_DEADLINE for a slow link; "
        error = Unreachable(f"{why}; {slow}{self.advice}")
        error.__cause__ = cause
        return error

    def _failed(self, why: str, nobody_listens: bool = False) -> None:
        """Count a request that failed for want of the server; it is down when `nobody_listens` (connection
        refused after the retries) or after DOWN_AFTER such failures with no answer between."""
        with self._failures_lock:
            self.failures += 1
            if nobody_listens or self.failures >= DOWN_AFTER:
                self.down = why

    def _answered(self) -> None:
        with self._failures_lock:
            self.failures = 0
            self.answered_at = time.monotonic()

    def _request(self, method: str, path: str, ok: tuple[int, ...] = (200,), cap: int = MAX_JSON,
                 **kwargs: Any) -> httpx.Response:
        """One request with retries on transient failures, within the deadline, its body read whole (_read: at
        most `cap` bytes); raises RemoteError for anything not in `ok`, and marks the server down when it cannot
        be reached in time or keeps failing."""
        self._check_up()
        began, end = time.monotonic(), self._end()
        for attempt in itertools.count():
            response = None
            try:
                with deadlines.until(end), \
                        self._client.stream(method, path, timeout=self._timeouts(end), **kwargs) as response:
                    self._read(response, end, cap)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                end = self._renewed(began, end)
                if is_last(attempt, self.retries, end, error=e):
                    raise self._give_up(f"cannot reach {self.url} ({type(e).__name__}: {e}){ran_out(end)}", e,
                                        nobody_listens=isinstance(e, httpx.ConnectError)) from e
            else:
                if response.status_code < 500:
                    self._answered()
                    return checked(response, ok, self.url)
                if is_last(attempt, self.retries, end, response):
                    self._failed(f"{method} {path} -> {response.status_code}")
                    return checked(response, ok, self.url)
            backoff(attempt, end, response)
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, ok: tuple[int, ...] = (200,), cap: int = MAX_JSON) -> Any:
        """The JSON body of a request; RemoteError (never a decode error) when the answer is not JSON, e.g. a
        proxy's or a wrong URL's HTML page."""
        return decoded(self._request(method, path, ok=ok, cap=cap), self.url)

    def _with_retries(self, what: str, began: float, end: float, attempt: Callable[[float], _T]) -> _T:
        """`attempt(end)`'s result, tried again after a timeout, a connection error or a 5xx (ServerError), with
        backoff, until the retries (is_last) or the deadline `end` (renewed while the server answers others:
        _renewed, for a request begun at `began`) run out; then the request fails (Unreachable: "<what> from
        <server> failed: <why>", counted by _failed). For streamed transfers, whose answer is read inside
        `attempt`, within the deadline it is given."""
        for n in itertools.count():
            try:
                result = attempt(end)
                self._answered()
                return result
            except (httpx.TimeoutException, httpx.TransportError, ServerError) as e:
                answer = e.response if isinstance(e, ServerError) else None
                end = self._renewed(began, end)
                if is_last(n, self.retries, end, answer, e):
                    raise self._give_up(f"{what} from {self.url} failed: {e}{ran_out(end)}", e,
                                        nobody_listens=isinstance(e, httpx.ConnectError)) from e
            backoff(n, end, answer)
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _streamed(self, method: str, path: str, end: float, **kwargs: Any) -> Iterator[Iterator[bytes]]:
        """The body of a 200 answer to `method path`, piece by piece as it arrives (_body, uncapped: objects stop
        at their listed size as they are stored). A 5xx raises ServerError (retried by _with_retries), any other
        answer RemoteError naming the server's reason."""
        with deadlines.until(end), self._client.stream(method, path, timeout=self._timeouts(end), **kwargs) as response:
            self._read_error(response, end)
            raise_for_5xx(response)
            checked(response, (200,), self.url)
            yield self._body(response, end, None)

    def _body(self, response: httpx.Response, end: float, cap: int | None) -> Iterator[bytes]:
        """The body of `response` piece by piece as it arrives: RemoteError once it passes `cap` bytes (None: no
        cap, for objects, which stop at their listed size as they are stored), and the server is given up on
        once the deadline `end` passes, however slowly it drips. A wait for the next piece is bounded by the read
        timeout, itself no longer than what was left of the deadline when the request began."""
        what, got = f"{response.request.method} {response.request.url}", 0
        for piece in response.iter_bytes():
            got += len(piece)
            if cap is not None and got > cap:
                raise AnswerTooLarge(f"{what} answered more than {cap >> 20} MiB, the most a client reads of it; "
                                  f"nothing of it was used: is {self.url} an fa4-aot server (or a proxy in front)?")
            if remaining(end) <= 0:
                raise self._give_up(f"{what} ran past its deadline ({got} bytes read)")
            yield piece

    def _read(self, response: httpx.Response, end: float, cap: int = MAX_JSON) -> httpx.Response:
        """`response` with its body read through _body, where httpx's own read() has no cap and no deadline."""
        response._content = b"".join(self._body(response, end, cap))  # what read() sets: .content, .json() work
        return response

    def _read_error(self, response: httpx.Response, end: float) -> None:
        """Read a streamed answer that is not a 200 here, capped and within the deadline `end`, so that its error
        can name the server's reason (httpx's read() would take any size at any pace)."""
        if response.status_code != 200:
            self._read(response, end)


def remaining(end: float) -> float:
    return end - time.monotonic()


def ran_out(end: float) -> str:
    """What ends a give-up message whose request used up its deadline `end` (a socket read bounded by what was
    left of it fails as a plain timeout), '' when retries ran out first."""
    return " (its deadline ran out)" if remaining(end) < MIN_ATTEMPT else ""


def timeouts(end: float, longest: float | None = None) -> httpx.Timeout:
    """Per-request timeouts that cannot outlast the deadline `end`, nor `longest` seconds."""
    left = max(0.01, min(remaining(end), longest if longest is not None else float("inf")))
    return httpx.Timeout(min(TIMEOUT.read or 30.0, left), connect=min(TIMEOUT.connect or 5.0, left))


def is_last(attempt: int, retries: int, end: float, answer: httpx.Response | None = None,
            error: BaseException | None = None) -> bool:
    """Whether failed attempt `attempt` is the last: too little time is left, or the retries are used up. A busy
    server (502, 503, 504), a timeout or a lost connection uses none: a cluster coming up backs off and finishes
    within the deadline rather than fail. A refused connection (nothing listens) and other 5xx use them."""
    busy = answer is not None and answer.status_code in (502, 503, 504)
    lost = error is not None and not isinstance(error, (httpx.ConnectError, ServerError))
    return remaining(end) < MIN_ATTEMPT or (attempt >= retries and not (busy or lost))


def backoff(attempt: int, end: float, answer: httpx.Response | None = None) -> None:
    """Sleep before retry `attempt` + 1 (exponential, jittered; at least the answer's Retry-After seconds, at
    most 8 s), never more than half of what is left before the deadline `end`: the retry gets the other half (a
    sleep to the deadline would leave it none, and a renewed deadline would be slept away again)."""
    wait = min(8.0, 0.2 * 2 ** min(attempt, 6)) * (0.5 + random.random())
    after = answer.headers.get("retry-after", "") if answer is not None else ""
    if after.isdigit():
        wait = max(wait, min(8.0, float(after)))
    time.sleep(max(0.0, min(wait, remaining(end) / 2)))


class AnswerTooLarge(RemoteError):
    """An answer longer than the most a client reads of it (the `cap` of Transport._request)."""


class ServerError(Exception):
    """A 5xx answer to a streamed request: retried as a connection error is."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.status_code}: {detail(response)}")
        self.response = response


def raise_for_5xx(response: httpx.Response) -> None:
    if response.status_code >= 500:
        raise ServerError(response)


def needed_scope(method: str, path: str) -> str:
    """The token scope the service wants for a request (service/deps.py): admin for revocations and the
    audit log, publish for other writes, read otherwise."""
    if path.startswith("/v1/audit") or (method == "POST" and path.startswith("/v1/revocations")):
        return "admin"
    return "read" if method in ("GET", "HEAD") else "publish"


def detail(response: httpx.Response) -> str:
    """The server's own reason (its JSON `detail`), else the start of the body."""
    response.read()
    try:
        reason = parsed(response.content, "").get("detail")
    except (RemoteError, AttributeError):
        reason = None
    return str(reason) if reason else response.text[:300]


def checked(response: httpx.Response, ok: tuple[int, ...], url: str) -> httpx.Response:
    """`response` when its status is in `ok`; RemoteAuthError naming the scope wanted and how to get a token for a
    401 or 403, RemoteError with the server's reason otherwise."""
    if response.status_code in ok:
        return response
    method, path = response.request.method, response.request.url.path
    if response.status_code in (401, 403):
        scope = needed_scope(method, path)
        fix = ("pass --token or set FA4_AOT_TOKEN" if response.status_code == 401 else "use another token") + \
            (f"; make one with `fa4-aot token create --scope {scope}` where the server's database is (the same "
             "--cache-dir or --db as `fa4-aot serve`)")
        raise RemoteAuthError(f"{url} refused {method} {path} ({response.status_code}: {detail(response)}); "
                              f"this needs a {scope} token: {fix}")
    raise RemoteError(f"{method} {response.request.url} -> {response.status_code}: {detail(response)}")


def decoded(response: httpx.Response, url: str) -> Any:
    """The JSON body of `response` (answers.parsed, the one parse of an answer); RemoteError naming the request,
    its status and content type when it is not JSON or nests too deep (never a decode error nor a RecursionError)."""
    request, kind = response.request, response.headers.get("content-type", "no content type")
    return parsed(response.content, f"{request.method} {request.url} ({response.status_code}, {kind})")


def shaped(doc: Any, kind: type[_T], url: str) -> _T:
    """`doc` when it is a `kind` (dict, list); RemoteError naming `url` otherwise."""
    if not isinstance(doc, kind):
        raise RemoteError(f"{url} answered with JSON of an unexpected shape ({type(doc).__name__}, expected "
                          f"{kind.__name__}): is it an fa4-aot server of this version?")
    return doc
