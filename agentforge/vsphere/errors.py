"""Typed errors of the vSphere layer, and the one place that classifies pyVmomi faults.

Callers branch on these classes, never on pyVmomi types: `NotFound` means vCenter
said the object is not there, which is different from every other failure (a
transport error is *never* "nothing there"). `TransientError` marks what is worth
retrying (connection errors, HTTP 503, `TaskInProgress`, a session that expired);
everything else is permanent and reported. Messages name the object and what to do;
they never carry credentials (the classifier only reads fault types and fault text
from vCenter, never request parameters).
"""

from __future__ import annotations

import http.client
import socket
import ssl
from datetime import datetime
from typing import Any

from agentforge.vsphere.vmomi import vim, vmodl


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
    """The ISO could not be fetched from its source URL."""


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


_TRANSIENT_FAULTS: tuple[type[BaseException], ...] = (
    vim.fault.TaskInProgress,
    vmodl.fault.HostCommunication,
    vim.fault.ConcurrentAccess,
    vim.fault.ResourceInUse,
    vim.fault.Timedout,
    vmodl.fault.SystemError,
)
_NOT_FOUND_FAULTS: tuple[type[BaseException], ...] = (
    vmodl.fault.ManagedObjectNotFound,
    vim.fault.FileNotFound,
    vim.fault.NotFound,
)
_EXISTS_FAULTS: tuple[type[BaseException], ...] = (
    vim.fault.DuplicateName,
    vim.fault.FileAlreadyExists,
    vim.fault.AlreadyExists,
)
_DENIED_FAULTS: tuple[type[BaseException], ...] = (
    vim.fault.InvalidLogin,
    vim.fault.NoPermission,
    vmodl.fault.SecurityError,
)
_INVALID_FAULTS: tuple[type[BaseException], ...] = (
    vmodl.fault.InvalidArgument,
    vmodl.fault.InvalidRequest,
    vmodl.fault.NotSupported,
    vmodl.fault.InvalidType,
    vim.fault.InvalidDeviceSpec,
    vim.fault.InvalidVmConfig,
    vim.fault.InvalidName,
    vim.fault.InvalidDatastorePath,
    vim.fault.InvalidController,
)
_STATE_FAULTS: tuple[type[BaseException], ...] = (
    vim.fault.InvalidState,
    vim.fault.InvalidPowerState,
)


def fault_name(exc: BaseException) -> str:
    """The vSphere fault name (`TaskInProgress`) or the Python class name."""
    wsdl = getattr(type(exc), "_wsdlName", None)
    return str(wsdl) if wsdl else type(exc).__name__


def fault_text(exc: BaseException) -> str:
    """vCenter's own message for a fault, without request details."""
    msg = getattr(exc, "msg", None)
    if isinstance(msg, str) and msg:
        return msg
    faults = getattr(exc, "faultMessage", None) or []
    texts = [str(getattr(m, "message", "") or "") for m in faults]
    return "; ".join(t for t in texts if t)


def classify(exc: BaseException, *, subject: str, action: str) -> VsphereError:
    """Turn any exception from a vCenter call into a typed `VsphereError`.

    `subject` names the object ("VM web-1", "datastore iso-ds"), `action` the
    operation ("power on"). Unknown errors become a plain `VsphereError` (permanent,
    reported): they are never read as "not found".
    """
    if isinstance(exc, VsphereError):
        return exc
    name = fault_name(exc)
    detail = fault_text(exc)
    where = f"{action} {subject}".strip()
    suffix = f": {detail}" if detail else ""

    def make(cls: type[VsphereError], hint: str = "") -> VsphereError:
        text = f"{where} failed with {name}{suffix}"
        if hint:
            text += f" ({hint})"
        return cls(text, subject=subject, fault=name)

    if isinstance(exc, vim.fault.NotAuthenticated):
        return make(SessionExpired, "the session expired; it is re-established and retried")
    if isinstance(exc, vim.fault.InvalidLogin):
        return make(PermissionDenied, "check the username and password in the credentials")
    if isinstance(exc, _TRANSIENT_FAULTS):
        return make(TransientError)
    if isinstance(exc, _NOT_FOUND_FAULTS):
        return make(NotFound)
    if isinstance(exc, _EXISTS_FAULTS):
        return make(AlreadyExists)
    if isinstance(exc, _DENIED_FAULTS):
        privilege = getattr(exc, "privilegeId", "") or ""
        hint = f"grant privilege {privilege}" if privilege else "grant the user the privilege"
        return make(PermissionDenied, hint)
    if isinstance(exc, _INVALID_FAULTS):
        return make(InvalidSpec)
    if isinstance(exc, _STATE_FAULTS):
        return make(InvalidState)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return ConnectionFailed(
            f"{where} failed: the vCenter certificate is not trusted ({exc.verify_message}); "
            "add its CA bundle to the credentials, or set insecure only for a lab",
            subject=subject,
            fault=UNTRUSTED_CERTIFICATE_FAULT,
        )
    if isinstance(exc, http.client.HTTPException):
        status = _http_status(str(exc))
        if status is None or status in (429, 502, 503, 504):
            return make(TransientError)
        if status in (401, 403):
            return make(PermissionDenied)
        if status == 404:
            return make(NotFound)
        return make(VsphereError)
    if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout, socket.gaierror)):
        return make(NetworkError, "vCenter did not answer")
    if isinstance(exc, OSError):
        return make(NetworkError)
    if isinstance(exc, vmodl.MethodFault):
        return make(TaskFailed)
    return make(VsphereError)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TransientError)


def _http_status(text: str) -> int | None:
    head = text.strip().split(" ", 1)[0]
    return int(head) if head.isdigit() else None


def describe(obj: Any) -> str:
    """A short, credential-free name for a pyVmomi managed object (`vm-42`)."""
    moid = getattr(obj, "_moId", None)
    return str(moid) if moid else repr(obj)
