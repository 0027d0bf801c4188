"""Typed errors of the vSphere layer (pure: `vsphere.faults` turns pyVmomi faults into them).

Callers branch on these classes, never on pyVmomi types: `NotFound` means vCenter
said the object is not there, which is different from every other failure (a
transport error is *never* "nothing there"). `TransientError` marks what is worth
retrying (connection errors, HTTP 503, `TaskInProgress`, a session that expired);
everything else is permanent and reported. Messages name the object and what to do;
they never carry credentials (the classifier only reads fault types and fault text
from vCenter, never request parameters).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any


class VsphereError(Exception):
    """Base of every error the vSphere layer raises; `subject` names the object."""

    def __init__(self, message: str, *, subject: str = "", fault: str = "") -> None:
        super().__init__(message)
        self.subject = subject
        self.fault = fault


UNTRUSTED_CERTIFICATE_FAULT = "SSLCertVerificationError"
"""The `fault` of an error whose cause is vCenter's certificate failing verification."""


class TransientError(VsphereError):
    """Worth retrying: connection trouble, a busy object, an expired session, HTTP 503."""


class SessionExpired(TransientError):
    """vCenter answered NotAuthenticated: the session must be re-established."""


class NetworkError(TransientError):
    """The connection to vCenter failed or a request went unanswered past its timeout.

    It opens the vCenter's circuit breaker: calls fail fast (`VcenterUnreachable`)
    for a cooldown instead of each waiting for its own timeout."""


class ConnectionFailed(VsphereError):
    """vCenter could not be reached or its certificate is not trusted (permanent)."""


class NotFound(VsphereError):
    """vCenter said the object does not exist."""


class AlreadyExists(VsphereError):
    """An object with that name exists (and is not ours to take)."""


class CreationInFlight(VsphereError):
    """vCenter refused a VM name (DuplicateName) that no object holds yet: a creation of
    that name is still running in the folder. Not "absent" and not a conflict: wait."""


class PermissionDenied(VsphereError):
    """Wrong credentials or a missing privilege."""


class SessionUnavailable(VsphereError):
    """No session can be had for these credentials now; nothing was sent to vCenter
    beyond the failed login this reports (if any).

    `retry_at` (UTC) is when the next login may be attempted; None means "when the
    credentials change". Subclasses say why; the base class covers the rest (an
    untrusted certificate, a refusal other than a wrong password)."""

    def __init__(
        self,
        message: str,
        *,
        subject: str = "",
        fault: str = "",
        retry_at: datetime | None = None,
    ) -> None:
        super().__init__(message, subject=subject, fault=fault)
        self.retry_at = retry_at

    def again(self) -> SessionUnavailable:
        """A fresh copy to raise once more (a stored error keeps no old traceback)."""
        return type(self)(str(self), subject=self.subject, fault=self.fault, retry_at=self.retry_at)


class LoginFailed(SessionUnavailable, PermissionDenied):
    """vCenter refused the login (`InvalidLogin`: wrong user or password). Retried only
    after a backoff, or at once when the credentials change."""


class LoginDeferred(SessionUnavailable):
    """Not attempted: the vCenter account has used its budget of failed logins for the
    lockout window, and one more might lock it for every user of that account."""


class VcenterUnreachable(SessionUnavailable):
    """vCenter did not answer (connection refused, timed out, black-holed): its calls
    fail fast until the cooldown ends."""


class LoginPending(Exception):
    """A login for these credentials is in flight and takes longer than a caller may
    wait. Not a `VsphereError`: nothing failed, so nothing should be reported as a
    failure; the caller comes back when the login ends (`SessionRegistry.subscribe`).
    """

    def __init__(self, message: str, *, key: Any) -> None:
        super().__init__(message)
        self.key = key


class TaskSlotPending(Exception):
    """Every task slot of the vCenter is taken (`--vsphere-max-tasks-in-flight`); the
    caller's token waits its turn. Not a `VsphereError`: nothing failed. The caller
    comes back when a slot is reserved for it (`SessionRegistry.subscribe_tasks`)."""

    def __init__(self, message: str, *, vcenter: str, token: str) -> None:
        super().__init__(message)
        self.vcenter = vcenter
        self.token = token


class InvalidSpec(VsphereError):
    """vCenter rejected the request as invalid; retrying the same request cannot help."""


class InvalidState(VsphereError):
    """The object is in a state that does not allow the operation."""


class OwnershipMismatch(VsphereError):
    """The VM does not carry our exact ownership markers: nothing was touched."""


class MediaMismatch(VsphereError):
    """The CD-ROM does not hold exactly the expected medium: nothing was touched."""


class QuestionRefused(VsphereError):
    """The pending VM question is not the one we are allowed to answer."""


class TaskFailed(VsphereError):
    """A vCenter task ended in error (a permanent fault)."""


class IsoSourceError(VsphereError):
    """The ISO could not be fetched from its source URL: the source refused it (this
    class and its subclasses, never a fault of the datastore or of vCenter)."""


class IsoDownloadFailed(IsoSourceError, TransientError):
    """The source could not be reached, answered 429 or 5xx, or its body broke off or
    ended short of its Content-Length: it may answer next time."""


class IsoInvalid(IsoSourceError):
    """The source answered, but not with a bootable ISO 9660 image (an HTML or JSON
    error page, an archive, a tiny or truncated body): nothing became boot media."""


class SizeLimitExceeded(IsoSourceError):
    """The ISO is larger than the configured limit; the upload was abandoned.

    `limit` and `size` (bytes; `size` None when the source announced none and the
    body went past the limit) let the caller name the setting that sets the limit."""

    def __init__(
        self, message: str, *, subject: str = "", limit: int = 0, size: int | None = None
    ) -> None:
        super().__init__(message, subject=subject)
        self.limit = limit
        self.size = size


class IsoSourceUntrusted(IsoSourceError):
    """The image service's TLS certificate did not verify against the trusted CAs."""


class IsoRedirectRefused(IsoSourceError):
    """The image service redirected to a URL that is not https, or too often."""
