"""Typed failures of the Kubernetes API, so callers never mistake one for another.

The rule this module exists for (STYLE.md rule 6): "the object is not there" is a
fact the server states (`NotFound`, HTTP 404); "I could not ask" is a `TransportError`
(connection refused or reset, TLS failure, timeout). Code that treats the second as
the first runs operations twice, so the two share only the `KubeError` root and a
caller that catches `NotFound` never swallows a transport failure.

Every answer the server gives as an error becomes an `ApiError` carrying the HTTP
status and the `Status` object's `reason` and `message`; the common ones have a
subclass (`NotFound`, `Conflict`, `AlreadyExists`, `Gone`, `Forbidden`, `Invalid`,
...). `from_response` is the one place that maps a status code and body to a class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "AlreadyExists",
    "ApiError",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeError",
    "MethodNotAllowed",
    "NotFound",
    "ServerError",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "from_response",
    "from_status",
]


class KubeError(Exception):
    """Root of every failure raised by `agentforge.kube.client`."""


class TransportError(KubeError):
    """The request did not get an answer: connection, TLS, timeout or a torn stream.

    Nothing can be concluded about the object; the operation may or may not have
    happened on the server.
    """


class ApiError(KubeError):
    """The server answered with an error `Status`."""

    def __init__(
        self,
        *,
        status: int,
        reason: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.details: Mapping[str, Any] = details or {}
        self.retry_after = retry_after


class BadRequest(ApiError):
    """400: the request was malformed (for example an invalid patch)."""


class Unauthorized(ApiError):
    """401: the credentials were missing, expired or rejected."""


class Forbidden(ApiError):
    """403: authenticated, but RBAC denies the verb on this resource."""


class NotFound(ApiError):
    """404: the object (or its namespace, or the resource type) does not exist."""


class MethodNotAllowed(ApiError):
    """405: the verb is not supported on this resource."""


class Conflict(ApiError):
    """409: a write lost an optimistic-concurrency race (stale resourceVersion)."""


class AlreadyExists(Conflict):
    """409 with reason AlreadyExists: a create found the name taken."""


class Gone(ApiError):
    """410: the requested resourceVersion is too old (expired); relist."""


class Invalid(ApiError):
    """422: the object failed validation; retrying the same write cannot help."""


class TooManyRequests(ApiError):
    """429: throttled by API priority and fairness; `retry_after` says when to retry."""


class ServerError(ApiError):
    """5xx: the server failed; usually transient."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # HTTP-date form: the apiserver never sends it; fall back to backoff
    return max(seconds, 0.0)


def from_status(
    status_obj: Mapping[str, Any], *, http_status: int | None = None, retry_after: str | None = None
) -> ApiError:
    """The `ApiError` for a decoded `Status` object (also used for watch ERROR events)."""
    code = int(status_obj.get("code") or http_status or 500)
    reason = str(status_obj.get("reason") or "")
    message = str(status_obj.get("message") or "")
    details = status_obj.get("details")
    cls: type[ApiError]
    if code == 409 and reason == "AlreadyExists":
        cls = AlreadyExists
    elif code >= 500:
        cls = ServerError
    else:
        cls = _BY_STATUS.get(code, ApiError)
    return cls(
        status=code,
        reason=reason or cls.__name__,
        message=message,
        details=details if isinstance(details, Mapping) else None,
        retry_after=_parse_retry_after(retry_after),
    )


def from_response(*, status: int, body: bytes, retry_after: str | None = None) -> ApiError:
    """The `ApiError` for an HTTP error answer; tolerates bodies that are not a Status."""
    status_obj: Mapping[str, Any] = {}
    try:
        decoded = json.loads(body) if body else {}
    except ValueError:
        decoded = {}
    if isinstance(decoded, Mapping) and decoded.get("kind") == "Status":
        status_obj = decoded
    else:
        text = body[:512].decode("utf-8", errors="replace").strip()
        status_obj = {"message": text}
    # The HTTP status wins over the body's code: proxies may send a bare body.
    return from_status({**status_obj, "code": status}, retry_after=retry_after)
