"""Error mapping rules: every status has its type; not-found is never a transport error."""

from __future__ import annotations

import json

import pytest

from agentforge.kube import errors


def status_body(code: int, reason: str, message: str = "m") -> bytes:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        }
    ).encode()


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        (400, "BadRequest", errors.BadRequest),
        (401, "Unauthorized", errors.Unauthorized),
        (403, "Forbidden", errors.Forbidden),
        (404, "NotFound", errors.NotFound),
        (409, "Conflict", errors.Conflict),
        (409, "AlreadyExists", errors.AlreadyExists),
        (410, "Expired", errors.Gone),
        (422, "Invalid", errors.Invalid),
        (429, "TooManyRequests", errors.TooManyRequests),
        (500, "InternalError", errors.ServerError),
        (503, "ServiceUnavailable", errors.ServerError),
        (418, "Teapot", errors.ApiError),
    ],
)
def test_each_status_code_maps_to_its_error_type(code: int, reason: str, cls: type) -> None:
    exc = errors.from_response(status=code, body=status_body(code, reason, "boom"))
    assert type(exc) is cls
    assert exc.status == code
    assert exc.reason == reason
    assert exc.message == "boom"


def test_not_found_and_transport_errors_share_no_branch_but_the_root() -> None:
    assert not issubclass(errors.NotFound, errors.TransportError)
    assert not issubclass(errors.TransportError, errors.ApiError)
    assert issubclass(errors.AlreadyExists, errors.Conflict)


def test_a_non_status_body_keeps_the_http_status_and_some_text() -> None:
    exc = errors.from_response(status=502, body=b"<html>bad gateway</html>")
    assert isinstance(exc, errors.ServerError)
    assert exc.status == 502
    assert "bad gateway" in exc.message


def test_retry_after_seconds_are_parsed_and_dates_ignored() -> None:
    assert errors.from_response(status=429, body=b"", retry_after="3").retry_after == 3.0
    http_date = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert errors.from_response(status=429, body=b"", retry_after=http_date).retry_after is None


def test_watch_error_event_status_maps_like_an_http_answer() -> None:
    exc = errors.from_status({"kind": "Status", "code": 410, "reason": "Expired", "message": "old"})
    assert isinstance(exc, errors.Gone)
