"""The one place that classifies pyVmomi faults into the typed errors of `model.errors`.

`classify` reads only fault types and vCenter's own fault text, never request
parameters, so no message it builds can carry credentials. A transport error is
never read as "not found"; unknown errors stay permanent and reported.
"""

from __future__ import annotations

import functools
import http.client
import socket
import ssl
from dataclasses import dataclass
from typing import Any

from agentforge.vsphere.model.errors import (
    UNTRUSTED_CERTIFICATE_FAULT,
    AlreadyExists,
    ConnectionFailed,
    InvalidSpec,
    InvalidState,
    NetworkError,
    NotFound,
    PermissionDenied,
    SessionExpired,
    TaskFailed,
    TransientError,
    VsphereError,
)
from agentforge.vsphere.vmomi import vim, vmodl


@dataclass(frozen=True, slots=True)
class _Families:
    """pyVmomi fault classes by the typed error they become (subclasses included)."""

    transient: tuple[type[BaseException], ...]
    not_found: tuple[type[BaseException], ...]
    exists: tuple[type[BaseException], ...]
    denied: tuple[type[BaseException], ...]
    invalid: tuple[type[BaseException], ...]
    state: tuple[type[BaseException], ...]


@functools.cache
def _families() -> _Families:
    """Built on the first fault, so importing this module does not load pyVmomi."""
    return _Families(
        transient=(
            vim.fault.TaskInProgress,
            vmodl.fault.HostCommunication,
            vim.fault.ConcurrentAccess,
            vim.fault.ResourceInUse,
            vim.fault.Timedout,
            vmodl.fault.SystemError,
        ),
        not_found=(
            vmodl.fault.ManagedObjectNotFound,
            vim.fault.FileNotFound,
            vim.fault.NotFound,
        ),
        exists=(
            vim.fault.DuplicateName,
            vim.fault.FileAlreadyExists,
            vim.fault.AlreadyExists,
        ),
        denied=(
            vim.fault.InvalidLogin,
            vim.fault.NoPermission,
            vmodl.fault.SecurityError,
        ),
        invalid=(
            vmodl.fault.InvalidArgument,
            vmodl.fault.InvalidRequest,
            vmodl.fault.NotSupported,
            vmodl.fault.InvalidType,
            vim.fault.InvalidDeviceSpec,
            vim.fault.InvalidVmConfig,
            vim.fault.InvalidName,
            vim.fault.InvalidDatastorePath,
            vim.fault.InvalidController,
        ),
        state=(
            vim.fault.InvalidState,
            vim.fault.InvalidPowerState,
        ),
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
    families = _families()
    if isinstance(exc, families.transient):
        return make(TransientError)
    if isinstance(exc, families.not_found):
        return make(NotFound)
    if isinstance(exc, families.exists):
        return make(AlreadyExists)
    if isinstance(exc, families.denied):
        privilege = getattr(exc, "privilegeId", "") or ""
        hint = f"grant privilege {privilege}" if privilege else "grant the user the privilege"
        return make(PermissionDenied, hint)
    if isinstance(exc, families.invalid):
        return make(InvalidSpec)
    if isinstance(exc, families.state):
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
