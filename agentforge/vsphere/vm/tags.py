"""Attaching vSphere tags (by ID) to a VM over the vAPI REST endpoint.

Tags are not part of the SOAP API. The vAPI session is created once per SOAP session
(basic auth over the verified TLS connection), kept in the session cache, and
created again on 401. All tags go in one `attach-multiple-tags-to-object` call;
vCenter's per-tag errors are reported together, naming the tag IDs.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import aiohttp

from agentforge.vsphere.model import errors
from agentforge.vsphere.session.vcenter_session import Session

SESSION_PATH = "/rest/com/vmware/cis/session"
ATTACH_PATH = "/rest/com/vmware/cis/tagging/tag-association"
HEADER = "vmware-api-session-id"


async def attach(session: Session, *, vm_moid: str, tag_ids: Sequence[str]) -> None:
    """Attach every tag to the VM; raise naming the tags vCenter refused."""
    if not tag_ids:
        return
    body = {"object_id": {"id": vm_moid, "type": "VirtualMachine"}, "tag_ids": list(tag_ids)}
    for attempt in range(2):
        token = await _token(session, fresh=attempt > 0)
        http = session.http()
        await session.throttle()
        try:
            async with http.post(
                ATTACH_PATH,
                params={"~action": "attach-multiple-tags-to-object"},
                json=body,
                headers={HEADER: token},
            ) as resp:
                if resp.status == 401 and attempt == 0:
                    continue
                if resp.status >= 400:
                    raise _http_error(resp.status, f"attach tags to VM {vm_moid}")
                payload: Any = await resp.json()
        except aiohttp.ClientError as exc:
            raise errors.TransientError(
                f"attach tags to VM {vm_moid} failed: {type(exc).__name__}", subject=vm_moid
            ) from None
        result = payload.get("value", payload) if isinstance(payload, dict) else {}
        if isinstance(result, dict) and result.get("success") is False:
            messages = [str(m.get("message", m)) for m in result.get("error_messages") or []]
            raise errors.InvalidSpec(
                f"attach tags {', '.join(tag_ids)} to VM {vm_moid} failed: {'; '.join(messages)} "
                "(check spec.vsphere.vmTags holds existing tag IDs)",
                subject=f"VM {vm_moid}",
            )
        return
    raise errors.PermissionDenied(f"vAPI refused the session for VM {vm_moid}", subject=vm_moid)


async def _token(session: Session, *, fresh: bool) -> str:
    cached = session.cache.vapi_token
    if cached is not None and not fresh:
        return cached
    creds = session.credentials
    http = session.http()
    try:
        basic = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
        async with http.post(SESSION_PATH, headers={"Authorization": f"Basic {basic}"}) as resp:
            if resp.status >= 400:
                raise _http_error(resp.status, f"create vAPI session for {creds.key}")
            payload: Any = await resp.json()
    except aiohttp.ClientError as exc:
        raise errors.TransientError(
            f"create vAPI session for {creds.key} failed: {type(exc).__name__}",
            subject=str(creds.key),
        ) from None
    token = payload.get("value") if isinstance(payload, dict) else payload
    if not isinstance(token, str) or not token:
        raise errors.VsphereError(f"vAPI session for {creds.key} returned no token")
    session.cache.vapi_token = token
    return token


def _http_error(status: int, what: str) -> errors.VsphereError:
    if status in (401, 403):
        return errors.PermissionDenied(f"{what}: HTTP {status}", subject=what)
    if status == 404:  # an unknown tag or object: the request is wrong, not a stale cache
        return errors.InvalidSpec(f"{what}: HTTP 404", subject=what)
    if status in (429, 502, 503, 504):
        return errors.TransientError(f"{what}: HTTP {status}", subject=what)
    return errors.VsphereError(f"{what}: HTTP {status}", subject=what)
