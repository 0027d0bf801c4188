"""`VcsimControl`: the async client of vcsim-af's fault-injection control API.

Each call opens its own short aiohttp session, so one `VcsimControl` works from any
event loop (pytest gives each test its own) and holds nothing that needs closing.
`reset_blocking()` does the between-tests clean-up from synchronous code.

The HTTP API behind it is documented in `sim/vcsim/README.md`; this module is a thin,
typed veneer: every method maps to one request, and a non-200 answer raises
`VcsimControlError` carrying the simulator's message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

import aiohttp

_TIMEOUT_S = 30.0

#: The choices of the CD-ROM lock question, and of `raise_question` when none are given.
YES_NO: tuple[tuple[str, str], ...] = (("0", "Yes"), ("1", "No"))


class VcsimControlError(RuntimeError):
    """The control API refused a request (bad argument, unknown VM, wrong state)."""

    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        super().__init__(f"vcsim control {method} {path} -> {status}: {message}")
        self.status = status
        self.message = message


class VcsimControl:
    """Fault injection, counters and the request log of one running vcsim-af."""

    def __init__(self, control_url: str) -> None:
        self.url = control_url.rstrip("/")

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        timeout = aiohttp.ClientTimeout(total=_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, self.url + path, json=body) as response,
        ):
            text = await response.text()
            try:
                payload = json.loads(text)
            except ValueError:
                payload = text
            if response.status != 200:
                raise VcsimControlError(method, path, response.status, _error_of(payload))
            return payload

    # --- the guest-locked CD-ROM door --------------------------------------------
    async def lock_cdrom(self, vm: str) -> dict[str, Any]:
        """Make the guest of `vm` (name, BIOS UUID or moref) lock its CD-ROM door.

        From then on a ReconfigVM_Task that disconnects or ejects a connected CD-ROM of
        that VM stays running while the VM asks `msg.cdromdisconnect.locked`. The VM must
        be powered on (409 otherwise). Returns `{"moref", "name", "uuid"}` of the VM.
        """
        result = await self._call("POST", "/cdrom/lock", {"vm": vm})
        return dict(result["vm"])

    async def unlock_cdrom(self, vm: str) -> dict[str, Any]:
        """Let the guest of `vm` release the door (a question already asked stays)."""
        result = await self._call("POST", "/cdrom/unlock", {"vm": vm})
        return dict(result["vm"])

    async def locked_cdroms(self) -> list[str]:
        """Morefs of the VMs whose guest holds the CD-ROM door locked."""
        return list((await self._call("GET", "/cdrom/locks"))["locked"])

    # --- questions -----------------------------------------------------------------
    async def raise_question(
        self,
        vm: str,
        message_id: str,
        text: str,
        *,
        choices: Sequence[tuple[str, str]] | None = None,
        default: str | None = None,
    ) -> str:
        """Make `vm` ask an arbitrary question; returns its id (e.g. `_vmx2`).

        `choices` are `(key, label)` pairs (default: a single `("0", "OK")`); AnswerVM
        with one of the keys clears it, as on a real vCenter.
        """
        body: dict[str, Any] = {"vm": vm, "message_id": message_id, "text": text}
        if choices is not None:
            body["choices"] = [{"key": key, "label": label} for key, label in choices]
        if default is not None:
            body["default"] = default
        return str((await self._call("POST", "/questions", body))["question_id"])

    async def questions(self) -> list[dict[str, Any]]:
        """Every pending question, per VM in queue order (`shown` marks runtime.question)."""
        return list((await self._call("GET", "/questions"))["questions"])

    # --- scripted failures ------------------------------------------------------------
    async def fail_next_tasks(
        self,
        method: str,
        n: int = 1,
        fault: str = "SystemError",
        *,
        stage: str | None = None,
        message: str | None = None,
        target: str | None = None,
    ) -> list[dict[str, Any]]:
        """Fail the next `n` calls of SOAP `method` with the vSphere fault named `fault`.

        stage "task" (the default for task methods such as CreateVM_Task) returns a task
        that ends in the fault and changes nothing; stage "call" (the default for other
        methods) fails the call itself. `target` limits the rule to one moref value.
        Calls without a valid session never consume a rule. Returns the active rules.
        """
        body: dict[str, Any] = {"method": method, "count": n, "fault": fault}
        if stage is not None:
            body["stage"] = stage
        if message is not None:
            body["message"] = message
        if target is not None:
            body["target"] = target
        return list((await self._call("POST", "/faults", body))["rules"])

    async def fault_rules(self) -> dict[str, Any]:
        """`{"rules": [...], "faults": [known names], "task_methods": [...]}`."""
        return dict(await self._call("GET", "/faults"))

    async def clear_faults(self) -> None:
        await self._call("DELETE", "/faults")

    # --- sessions ----------------------------------------------------------------------
    async def end_sessions(self) -> dict[str, Any]:
        """End every session (SOAP and vAPI): the next call of any client gets
        NotAuthenticated (SOAP) or 401 (vAPI) and must log in again."""
        return dict(await self._call("POST", "/sessions/end"))

    # --- counters and the request log -------------------------------------------------
    async def counters(self) -> dict[str, Any]:
        """`{"methods": {SOAP method: n}, "paths": {"/sdk": n, "/folder": n, ...},
        "http": {"PUT /folder": n, ...}, "logins": n, "rest_logins": n,
        "faults_injected": n}`; logins count successful SOAP logins only."""
        return dict(await self._call("GET", "/counters"))

    async def reset_counters(self) -> None:
        await self._call("POST", "/counters/reset")

    async def request_log(
        self, method: str | None = None, *, kind: str | None = None, since: int = 0
    ) -> list[dict[str, Any]]:
        """Logged requests, oldest first, optionally for one SOAP method or kind.

        Every entry has `seq`, `time`, `kind` ("soap" or "http"), `http_method`, `path`,
        `status` (0 while in flight) and, for SOAP, `method` and `target` ({type, value}),
        plus `fault`/`fault_message` when it failed. ReconfigVM_Task entries carry
        `cdrom_disconnect`, `cdrom_device_keys` and `cdrom` (per CD-ROM change); AnswerVM
        entries carry `question_id` and `answer_choice`. `since` skips entries up to
        that `seq`.
        """
        query = {"since": str(since)}
        if method is not None:
            query["method"] = method
        if kind is not None:
            query["kind"] = kind
        result = await self._call("GET", "/log?" + urllib.parse.urlencode(query))
        return list(result["entries"])

    async def last_seq(self) -> int:
        """The `seq` of the latest logged request (0 when none): a mark for `since`."""
        return int((await self._call("GET", "/log?limit=0"))["last_seq"])

    async def clear_request_log(self) -> None:
        await self._call("DELETE", "/log")

    # --- delays --------------------------------------------------------------------------
    async def set_delay(self, method: str, ms: int, *, stage: str = "call") -> dict[str, int]:
        """Slow `method` down by `ms` (0 removes the delay); returns that stage's delays.

        stage "call": every call of SOAP `method` (or of an HTTP key like "PUT /folder")
        waits before the simulator handles it. stage "task" (task methods only): the call
        answers at once, but its task stays `running` for `ms` before the method does its
        work and the task ends as the real one does; nothing is locked meanwhile, so the
        inventory stays readable (an in-flight task, as on a busy vCenter).
        """
        body = {"method": method, "ms": ms, "stage": stage}
        result = await self._call("POST", "/delays", body)
        return dict(result["task_delays" if stage == "task" else "delays"])

    async def delays(self) -> dict[str, dict[str, int]]:
        """`{"delays": {key: ms}, "task_delays": {method: ms}}`."""
        return dict(await self._call("GET", "/delays"))

    async def clear_delays(self) -> None:
        await self._call("DELETE", "/delays")

    # --- everything ----------------------------------------------------------------------
    async def reset(self) -> None:
        """Clear faults, delays, door locks, counters and the log. Questions stay: they
        belong to VMs and running tasks."""
        await self._call("POST", "/reset")

    def reset_blocking(self) -> None:
        """`reset()` from synchronous code (fixtures), without an event loop."""
        request = urllib.request.Request(self.url + "/reset", method="POST", data=b"")
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                response.read()
        except urllib.error.HTTPError as e:
            message = e.read().decode(errors="replace")
            raise VcsimControlError("POST", "/reset", e.code, message) from e


def _error_of(payload: Any) -> str:
    if isinstance(payload, dict) and "error" in payload:
        return str(payload["error"])
    if isinstance(payload, str):
        return payload.strip()
    return json.dumps(payload)
