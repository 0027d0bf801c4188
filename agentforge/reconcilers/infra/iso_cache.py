"""The ISO cache's decisions, pure: when to re-check, what status to write, what to prune.

Everything here is a function of values (the pool's `status.iso`, the InfraEnv URL,
files listed on the datastore, backings vSphere reports attached, `now`), so the
rules that decide whether a file may be deleted are unit-tested without I/O:

* **re-check** when there is no path yet, the URL changed, the prefix changed, a new
  force-refresh token appeared, or `checkInterval` passed since `checkedAt`; otherwise
  wake up exactly when the interval ends;
* **the URL in status** is its shown form (`redaction.redact_url`): the image
  service's key, in the path (`/byapikey/<JWT>/`) or the query (`api_key=`), is
  `[REDACTED]`, the rest (host, version, architecture) stays for people to read. The
  shown form cannot tell two keys apart, so a change is detected by `urlHash`, the
  sha256 of the whole URL (kept in status, so a restart or another replica sees a
  change made while it was not looking). It is one-way: the image service's keys
  are signed tokens, which no digest gives back (a guessable password in URL user
  info could be tried against it, as against any digest: image service URLs carry
  none). Both fields are written together, after each check. A status an older
  version wrote is corrected without a check (`same_url`, `shown_status`): one with
  the digest but another shown form (an agent-forge that showed the path's key) is
  rewritten; one without a digest, whose `url` is the whole URL (a version that
  stored it so), describes the current URL when that URL equals it, and gets the
  shown form and the digest; any other is a changed URL, checked once;
* **history** is newest first, one entry per path, the current ISO always first,
  cut to `retainVersions`;
* **prune** only content-addressed files (`<prefix>/<64 hex>.iso`, directly under the
  prefix) and history paths that are beyond retention, that no VM's CD-ROM holds (as
  vSphere reports it, not as history says), that no in-flight creation recorded, and
  that no other pool sharing the folder keeps. A file no status names is younger
  than `orphan_grace` may be another pool's fresh upload whose status write is still
  to come: it is left for a later check;
* **stale uploads**: a temporary upload (`<prefix>/.upload-<32 hex>.iso`, directly
  under the prefix, nothing else) whose last write is older than `stale_upload_age`
  (`IsoLimits.stale_upload_age`: no running upload of any replica or pool leaves its
  file unwritten that long) was left by a killed process and is deleted; one of
  unknown age is kept. They are looked for when something else is pruned, and at
  most every `stale_upload_age` otherwise (`sweep_due`), so a steady pool pays one
  listing per that age;
* **refusals** (`Refusal`): a check the source refused (an `IsoSourceError`: no boot
  image, a body cut short, an error answer, a refused redirect...) is not tried
  again before `retry_delay` has passed: 30 s after the first refusal in a row,
  doubling to 10 min. The refusal is the source URL's, not a pool's: every pool caching
  that URL waits for the same next try, but for a force-iso-refresh token it has not
  tried yet (an admin's "try now").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from agentforge.api.pool import ISOHistoryEntry, ISOSourceValidators, ISOStatus
from agentforge.redaction import redact_url
from agentforge.vsphere import IsoLimits, IsoRecord, IsoResult, IsoSourceError, Validators
from agentforge.vsphere.iso import upload as iso_upload

__all__ = [
    "CheckReason",
    "PrunePlan",
    "Refusal",
    "StoredFile",
    "check_due",
    "next_check_at",
    "plan_prune",
    "previous_record",
    "redact_url",
    "relative_path",
    "retry_delay",
    "same_url",
    "shown_status",
    "split_backing",
    "sweep_due",
    "updated_status",
    "url_hash",
]

_CONTENT_NAME = re.compile(r"[0-9a-f]{64}\.iso")
_BACKING = re.compile(r"^\[(?P<ds>[^\]]+)\]\s*(?P<path>.+)$")
DEFAULT_ORPHAN_GRACE = timedelta(hours=1)
DEFAULT_STALE_UPLOAD_AGE = IsoLimits().stale_upload_age
FIRST_RETRY: Final = timedelta(seconds=30)
"""After the first refusal of a source URL in a row, the next try waits this long..."""
MAX_RETRY: Final = timedelta(minutes=10)
"""...doubling after each further refusal, to at most this."""


class CheckReason(StrEnum):
    """Why the ISO is checked now (also the event/log wording)."""

    NO_PATH = "no ISO is cached yet"
    URL_CHANGED = "the InfraEnv ISO URL changed"
    PREFIX_CHANGED = "spec.iso.pathPrefix changed"
    FORCE_REFRESH = "a new force-iso-refresh token was set"
    INTERVAL_PASSED = "spec.iso.checkInterval passed"


def url_hash(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


def same_url(status: ISOStatus, url: str) -> bool:
    """Does `status` describe the ISO of `url`? By the digest; a status without one
    (written by a version that stored the whole URL) by its `url`."""
    if status.url_hash:
        return status.url_hash == url_hash(url)
    return bool(status.url) and status.url == url


def shown_status(status: ISOStatus, *, url: str) -> ISOStatus | None:
    """`status` with `url` in its shown form and its digest, when `status` describes
    `url` (`same_url`) but holds another form (an older version's); else None."""
    shown, digest = redact_url(url), url_hash(url)
    if not same_url(status, url) or (status.url, status.url_hash) == (shown, digest):
        return None
    return status.model_copy(update={"url": shown, "url_hash": digest})


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def check_due(
    status: ISOStatus,
    *,
    url: str,
    prefix: str,
    token: str | None,
    interval: timedelta,
    now: datetime,
) -> CheckReason | None:
    """Why a check is due now, or None when the cached ISO stands until `next_check_at`."""
    if not status.path:
        return CheckReason.NO_PATH
    if not same_url(status, url):
        return CheckReason.URL_CHANGED
    if _folder(status.path) != prefix.strip("/"):
        return CheckReason.PREFIX_CHANGED
    if token and token != status.force_refresh_token:
        return CheckReason.FORCE_REFRESH
    if status.checked_at is None or now >= status.checked_at + interval:
        return CheckReason.INTERVAL_PASSED
    return None


def next_check_at(status: ISOStatus, *, interval: timedelta) -> datetime | None:
    return status.checked_at + interval if status.checked_at is not None else None


def previous_record(status: ISOStatus, *, url: str) -> IsoRecord | None:
    """What revalidation may compare with: only validators of this very URL count."""
    if not (status.sha256 and status.path and same_url(status, url)):
        return None
    stored = status.validators or ISOSourceValidators()
    return IsoRecord(
        sha256=status.sha256,
        size=status.size_bytes or 0,
        validators=Validators(
            etag=stored.etag,
            last_modified=stored.last_modified,
            content_length=stored.content_length,
        ),
    )


def updated_status(
    status: ISOStatus,
    *,
    result: IsoResult,
    url: str,
    token: str | None,
    now: datetime,
) -> ISOStatus:
    """`status.iso` after a successful check; the history is cut by `plan_prune`."""
    moved = result.path != status.path
    uploaded_at = status.uploaded_at
    if moved or not result.reused or uploaded_at is None:
        uploaded_at = now
    current = ISOHistoryEntry(
        path=result.path, sha256=result.sha256, size_bytes=result.size, uploaded_at=uploaded_at
    )
    previous = list(status.history)
    if status.path and status.sha256 and all(e.path != status.path for e in previous):
        previous.insert(
            0,
            ISOHistoryEntry(
                path=status.path,
                sha256=status.sha256,
                size_bytes=status.size_bytes,
                uploaded_at=status.uploaded_at,
            ),
        )
    history = [current, *(e for e in previous if e.path != current.path)]
    return status.model_copy(
        update={
            "url": redact_url(url),
            "url_hash": url_hash(url),
            "path": result.path,
            "sha256": result.sha256,
            "size_bytes": result.size,
            "checked_at": now,
            "uploaded_at": uploaded_at,
            "force_refresh_token": token or status.force_refresh_token,
            "validators": ISOSourceValidators(
                etag=result.validators.etag,
                last_modified=result.validators.last_modified,
                content_length=result.validators.content_length,
            ),
            "history": history,
        }
    )


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A file found on the ISO datastore (path relative to the datastore root)."""

    path: str
    size: int | None = None
    modified: datetime | None = None


@dataclass(frozen=True, slots=True)
class PrunePlan:
    delete: tuple[str, ...]
    """Paths to delete (relative to the datastore root)."""
    in_use: tuple[str, ...]
    """Paths beyond retention that a VM (or an in-flight creation) still holds."""
    history: tuple[ISOHistoryEntry, ...]
    """The history to write if every delete succeeds (a failed one is added back)."""
    stale_uploads: tuple[str, ...] = ()
    """Temporary uploads a killed process left behind, to delete (never in history)."""


def split_backing(backing: str) -> tuple[str, str] | None:
    """`[ds] a/b.iso` -> (`ds`, `a/b.iso`); None for anything else."""
    match = _BACKING.match(backing.strip())
    if match is None:
        return None
    return match.group("ds"), match.group("path").strip().lstrip("/")


def relative_path(backing: str, *, datastore: str) -> str | None:
    """`[ds] a/b.iso` -> `a/b.iso` when it is on `datastore`, else None."""
    split = split_backing(backing)
    return split[1] if split is not None and split[0] == datastore else None


def is_content_addressed(path: str, *, prefix: str) -> bool:
    folder, _, name = path.rpartition("/")
    return folder == prefix.strip("/") and bool(_CONTENT_NAME.fullmatch(name))


def is_temp_upload(path: str, *, prefix: str) -> bool:
    folder, _, name = path.rpartition("/")
    return folder == prefix.strip("/") and bool(iso_upload.TEMP_NAME.fullmatch(name))


def sweep_due(last: datetime | None, *, now: datetime, every: timedelta) -> bool:
    """Look for stale uploads now? Never looked (in this process), or `every` passed."""
    return last is None or now - last >= every


def plan_prune(
    *,
    history: Sequence[ISOHistoryEntry],
    retain: int,
    prefix: str,
    files: Iterable[StoredFile],
    in_use: Collection[str],
    kept_elsewhere: Collection[str],
    now: datetime,
    orphan_grace: timedelta = DEFAULT_ORPHAN_GRACE,
    stale_upload_age: timedelta = DEFAULT_STALE_UPLOAD_AGE,
) -> PrunePlan:
    """Which files to delete and which history to keep (see the module doc)."""
    keep_count = max(retain, 1)
    retained = list(history[:keep_count])
    beyond = list(history[keep_count:])
    retained_paths = {e.path for e in retained}
    known = {e.path for e in history} | set(kept_elsewhere)
    delete: list[str] = []
    stale: list[str] = []
    held: list[ISOHistoryEntry] = []
    for entry in beyond:
        if entry.path in retained_paths or entry.path in kept_elsewhere:
            continue
        if entry.path in in_use:
            held.append(entry)
        elif entry.path not in delete:
            delete.append(entry.path)
    for stored in sorted(files, key=lambda f: f.path):
        path = stored.path.strip("/")
        if is_temp_upload(path, prefix=prefix):
            old = stored.modified is not None and now - stored.modified >= stale_upload_age
            if old and path not in in_use and path not in known:
                stale.append(path)
            continue
        if not is_content_addressed(path, prefix=prefix) or path in known or path in delete:
            continue
        if path in in_use:
            held.append(_entry_for(stored))
            continue
        if stored.modified is not None and now - stored.modified < orphan_grace:
            continue
        delete.append(path)
    return PrunePlan(
        delete=tuple(delete),
        in_use=tuple(e.path for e in held),
        history=tuple([*retained, *held]),
        stale_uploads=tuple(stale),
    )


def _entry_for(stored: StoredFile) -> ISOHistoryEntry:
    name = stored.path.rpartition("/")[2]
    return ISOHistoryEntry(
        path=stored.path.strip("/"),
        sha256=name.removesuffix(".iso"),
        size_bytes=stored.size,
        uploaded_at=stored.modified,
    )


def retry_delay(
    failures: int, *, first: timedelta = FIRST_RETRY, cap: timedelta = MAX_RETRY
) -> timedelta:
    """The rest after `failures` refusals in a row: `first`, doubled per refusal after
    the first, at most `cap` (30 s, 1, 2, 4, 8, then 10 min)."""
    return min(first * (1 << min(max(failures - 1, 0), 20)), cap)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The refusals in a row of one source URL: the last error and when to try again."""

    error: IsoSourceError
    failures: int
    next_try: datetime
    tokens: frozenset[str] = frozenset()
    """The force-iso-refresh tokens that were tried and refused."""

    @classmethod
    def first(cls, error: IsoSourceError, *, now: datetime, token: str | None) -> Refusal:
        return cls(
            error=error,
            failures=1,
            next_try=now + retry_delay(1),
            tokens=frozenset((token,) if token else ()),
        )

    def again(self, error: IsoSourceError, *, now: datetime, token: str | None) -> Refusal:
        """One more refusal in a row."""
        failures = self.failures + 1
        return Refusal(
            error=error,
            failures=failures,
            next_try=now + retry_delay(failures),
            tokens=self.tokens | ({token} if token else set()),
        )

    def blocks(self, *, now: datetime, token: str | None) -> bool:
        """Is a try now too early? `token`: a force-iso-refresh token that asks for this
        check (None when the check is due for another reason); one not tried yet is
        never blocked."""
        return now < self.next_try and (token is None or token in self.tokens)

    def expired(self, *, now: datetime, cap: timedelta = MAX_RETRY) -> bool:
        """Nobody tried the URL again within `cap` of its next try: forget it (a URL
        that changed is never tried again)."""
        return now >= self.next_try + cap
