"""The ISO cache's pure rules: when to re-check, what status says, what may be pruned."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agentforge.api.pool import ISOHistoryEntry, ISOSourceValidators, ISOStatus
from agentforge.reconcilers.infra import iso_cache
from agentforge.reconcilers.infra.iso_cache import CheckReason, StoredFile
from agentforge.vsphere import IsoLimits, IsoResult, Validators

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
URL = "https://assisted.example/images/abc?api_key=secret-jwt&version=4.16"
PREFIX = "agent-forge/ns/pool"
TEN_MIN = timedelta(minutes=10)


def sha(n: int) -> str:
    return f"{n:064x}"


def path(n: int, prefix: str = PREFIX) -> str:
    return f"{prefix}/{sha(n)}.iso"


def entry(n: int, prefix: str = PREFIX) -> ISOHistoryEntry:
    return ISOHistoryEntry(path=path(n, prefix), sha256=sha(n), size_bytes=10, uploaded_at=NOW)


def cached(**changes: object) -> ISOStatus:
    base = ISOStatus(
        url=iso_cache.redact_url(URL),
        url_hash=iso_cache.url_hash(URL),
        path=path(1),
        sha256=sha(1),
        size_bytes=10,
        checked_at=NOW - timedelta(minutes=1),
        uploaded_at=NOW - timedelta(hours=1),
        force_refresh_token="t1",
        validators=ISOSourceValidators(etag='"v1"', content_length=10),
        history=[entry(1)],
    )
    return base.model_copy(update=changes)


def due(status: ISOStatus, **kw: object) -> CheckReason | None:
    args: dict[str, object] = {
        "url": URL,
        "prefix": PREFIX,
        "token": "t1",
        "interval": TEN_MIN,
        "now": NOW,
    }
    args.update(kw)
    return iso_cache.check_due(status, **args)  # type: ignore[arg-type]


# --- when to check -----------------------------------------------------------------------


def test_a_fresh_cache_is_not_checked_before_the_interval_ends() -> None:
    status = cached()
    assert due(status) is None
    assert iso_cache.next_check_at(status, interval=TEN_MIN) == NOW + timedelta(minutes=9)


def test_no_path_yet_means_check_now() -> None:
    assert due(ISOStatus()) is CheckReason.NO_PATH


def test_a_changed_query_counts_as_a_changed_url() -> None:
    assert due(cached(), url=URL.replace("4.16", "4.17")) is CheckReason.URL_CHANGED


def test_a_changed_prefix_means_check_now() -> None:
    assert due(cached(), prefix="elsewhere/pool") is CheckReason.PREFIX_CHANGED


def test_a_new_force_token_means_check_now_and_the_same_token_does_not() -> None:
    assert due(cached(), token="t2") is CheckReason.FORCE_REFRESH
    assert due(cached(), token="t1") is None
    assert due(cached(), token=None) is None


def test_the_check_is_due_exactly_when_the_interval_passed() -> None:
    status = cached(checked_at=NOW - TEN_MIN)
    assert due(status) is CheckReason.INTERVAL_PASSED
    assert due(status, now=NOW - timedelta(seconds=1)) is None


JWT = (
    "eyJhbGciOiJFUzI1NiIsInR5cCI6IkpXVCJ9.eyJpbmZyYV9lbnZfaWQiOiI3ZDQ2MThhZiJ9."
    "MEUCIQDx2Vt8l1cY9x8Wm3b5Q_5bOQ2hX9yQ1nC3pZr0uL4kGgIgT"
)
PATH_URL = f"https://images.example/byapikey/{JWT}/4.14/x86_64/minimal.iso"
SHOWN_PATH_URL = "https://images.example/byapikey/[REDACTED]/4.14/x86_64/minimal.iso"


def test_the_stored_url_shows_which_image_but_no_key() -> None:
    after = iso_cache.updated_status(
        ISOStatus(), result=result(1, reused=False), url=PATH_URL, token=None, now=NOW
    )
    assert after.url == SHOWN_PATH_URL
    assert JWT not in after.model_dump_json()
    query = iso_cache.updated_status(
        ISOStatus(), result=result(1, reused=False), url=URL, token=None, now=NOW
    )
    assert query.url == "https://assisted.example/images/abc?api_key=[REDACTED]&version=4.16"


def test_a_new_key_behind_the_same_shown_url_is_a_changed_url() -> None:
    status = cached(url=SHOWN_PATH_URL, url_hash=iso_cache.url_hash(PATH_URL))
    assert due(status, url=PATH_URL) is None
    other_key = PATH_URL.replace(JWT, JWT[:-4] + "AAAA")
    assert iso_cache.redact_url(other_key) == SHOWN_PATH_URL
    assert due(status, url=other_key) is CheckReason.URL_CHANGED
    assert iso_cache.previous_record(status, url=other_key) is None


def test_an_older_agent_forge_status_showing_the_key_is_rewritten_without_a_check() -> None:
    # What agent-forge wrote before: the path (and its key) kept, the query dropped.
    old = cached(
        url=f"https://images.example/byapikey/{JWT}/4.14/x86_64/minimal.iso",
        url_hash=iso_cache.url_hash(PATH_URL),
    )
    assert due(old, url=PATH_URL) is None
    assert iso_cache.previous_record(old, url=PATH_URL) is not None
    rewritten = iso_cache.shown_status(old, url=PATH_URL)
    assert rewritten is not None
    assert (rewritten.url, rewritten.url_hash) == (SHOWN_PATH_URL, old.url_hash)
    assert rewritten.model_copy(update={"url": old.url}) == old, "nothing else changes"
    assert iso_cache.shown_status(rewritten, url=PATH_URL) is None, "written once"


def test_a_status_holding_the_whole_url_without_digest_is_reused_and_rewritten() -> None:
    legacy = cached(url=PATH_URL, url_hash=None)
    assert due(legacy, url=PATH_URL) is None, "the same URL: no download"
    assert iso_cache.previous_record(legacy, url=PATH_URL) is not None
    rewritten = iso_cache.shown_status(legacy, url=PATH_URL)
    assert rewritten is not None
    assert rewritten.url == SHOWN_PATH_URL
    assert rewritten.url_hash == iso_cache.url_hash(PATH_URL)
    assert due(rewritten, url=PATH_URL) is None


def test_a_status_without_digest_for_another_url_is_checked_and_not_rewritten() -> None:
    legacy = cached(url="https://images.example/old.iso", url_hash=None)
    assert due(legacy, url=PATH_URL) is CheckReason.URL_CHANGED
    assert iso_cache.shown_status(legacy, url=PATH_URL) is None
    assert iso_cache.previous_record(legacy, url=PATH_URL) is None
    assert due(cached(url=None, url_hash=None), url=PATH_URL) is CheckReason.URL_CHANGED


# --- revalidation and status --------------------------------------------------------------


def test_revalidation_uses_stored_validators_only_for_the_same_url() -> None:
    record = iso_cache.previous_record(cached(), url=URL)
    assert record is not None
    assert record.sha256 == sha(1)
    assert record.validators == Validators(etag='"v1"', content_length=10)
    assert iso_cache.previous_record(cached(), url=URL + "&x=1") is None
    assert iso_cache.previous_record(ISOStatus(), url=URL) is None


def result(n: int, *, reused: bool) -> IsoResult:
    return IsoResult(
        sha256=sha(n),
        size=20,
        path=path(n),
        backing=f"[iso-ds] {path(n)}",
        validators=Validators(etag=f'"v{n}"', content_length=20),
        bytes_downloaded=0 if reused else 20,
        reused=reused,
    )


def test_an_unchanged_iso_keeps_its_upload_time_and_moves_the_check_time() -> None:
    before = cached()
    after = iso_cache.updated_status(
        before, result=result(1, reused=True), url=URL, token="t1", now=NOW
    )
    assert after.checked_at == NOW
    assert after.uploaded_at == before.uploaded_at
    assert [e.path for e in after.history] == [path(1)]


def test_a_new_iso_goes_first_in_history_and_records_its_validators() -> None:
    after = iso_cache.updated_status(
        cached(history=[entry(1), entry(0)]),
        result=result(2, reused=False),
        url=URL,
        token="t2",
        now=NOW,
    )
    assert after.path == path(2)
    assert after.uploaded_at == NOW
    assert after.force_refresh_token == "t2"
    assert after.validators == ISOSourceValidators(etag='"v2"', content_length=20)
    assert [e.path for e in after.history] == [path(2), path(1), path(0)]


def test_a_previous_iso_missing_from_history_is_added_so_it_can_be_pruned() -> None:
    after = iso_cache.updated_status(
        cached(history=[]), result=result(2, reused=False), url=URL, token=None, now=NOW
    )
    assert [e.path for e in after.history] == [path(2), path(1)]


# --- pruning ------------------------------------------------------------------------------


def old(n: int, prefix: str = PREFIX) -> StoredFile:
    return StoredFile(path=path(n, prefix), size=10, modified=NOW - timedelta(days=1))


def plan(**kw: object) -> iso_cache.PrunePlan:
    args: dict[str, object] = {
        "history": [entry(3), entry(2), entry(1)],
        "retain": 2,
        "prefix": PREFIX,
        "files": [old(1), old(2), old(3)],
        "in_use": (),
        "kept_elsewhere": (),
        "now": NOW,
    }
    args.update(kw)
    return iso_cache.plan_prune(**args)  # type: ignore[arg-type]


def test_files_beyond_retention_are_pruned_and_the_retained_kept() -> None:
    result = plan()
    assert result.delete == (path(1),)
    assert [e.path for e in result.history] == [path(3), path(2)]


def test_the_current_iso_is_kept_even_with_one_retained_version() -> None:
    result = plan(retain=1)
    assert set(result.delete) == {path(1), path(2)}
    assert [e.path for e in result.history] == [path(3)]


def test_a_file_a_vm_still_holds_is_never_pruned_and_stays_in_history() -> None:
    result = plan(retain=1, in_use={path(1)})
    assert result.delete == (path(2),)
    assert result.in_use == (path(1),)
    assert [e.path for e in result.history] == [path(3), path(1)]


def test_history_alone_does_not_decide_an_unlisted_file_still_attached_is_kept() -> None:
    result = plan(history=[entry(3)], retain=1, files=[old(3), old(7)], in_use={path(7)})
    assert result.delete == ()
    assert [e.path for e in result.history] == [path(3), path(7)]


def test_an_old_orphan_file_under_the_prefix_is_pruned() -> None:
    result = plan(history=[entry(3)], retain=1, files=[old(3), old(7)])
    assert result.delete == (path(7),)


def test_a_young_orphan_may_be_another_pools_fresh_upload_and_is_kept() -> None:
    young = StoredFile(path=path(7), size=10, modified=NOW - timedelta(minutes=5))
    result = plan(history=[entry(3)], retain=1, files=[old(3), young])
    assert result.delete == ()


def test_files_another_pool_sharing_the_folder_names_are_kept() -> None:
    result = plan(kept_elsewhere={path(1)})
    assert result.delete == ()


def test_only_content_addressed_files_directly_under_the_prefix_are_candidates() -> None:
    files = [
        old(3),
        StoredFile(path=f"{PREFIX}/.upload-1234.iso", modified=NOW - timedelta(days=1)),
        StoredFile(path=f"{PREFIX}/manual.iso", modified=NOW - timedelta(days=1)),
        old(8, prefix=f"{PREFIX}/nested-pool"),
        old_upload(prefix=f"{PREFIX}/nested-pool"),
    ]
    result = plan(history=[entry(3)], retain=1, files=files)
    assert result.delete == ()
    assert result.stale_uploads == ()


# --- temporary uploads a killed process left behind ---------------------------------------

UPLOAD = ".upload-" + "ab" * 16 + ".iso"
HOUR = timedelta(hours=1)


def old_upload(
    *, prefix: str = PREFIX, age: timedelta | None = timedelta(days=1), name: str = UPLOAD
) -> StoredFile:
    return StoredFile(path=f"{prefix}/{name}", size=5, modified=None if age is None else NOW - age)


def test_an_upload_unwritten_for_the_stale_age_is_deleted_and_kept_out_of_history() -> None:
    result = plan(history=[entry(3)], retain=1, files=[old(3), old_upload(age=HOUR)])
    assert result.stale_uploads == (f"{PREFIX}/{UPLOAD}",)
    assert result.delete == ()
    assert [e.path for e in result.history] == [path(3)]


def test_an_upload_written_within_the_stale_age_may_be_running_and_is_kept() -> None:
    young = old_upload(age=HOUR - timedelta(seconds=1))
    assert plan(history=[entry(3)], retain=1, files=[old(3), young]).stale_uploads == ()


def test_an_upload_of_unknown_age_is_kept() -> None:
    unknown = old_upload(age=None)
    assert plan(history=[entry(3)], retain=1, files=[old(3), unknown]).stale_uploads == ()


def test_the_stale_age_is_the_callers() -> None:
    upload = old_upload(age=3 * HOUR)
    longer = plan(files=[upload], stale_upload_age=4 * HOUR)
    assert longer.stale_uploads == ()
    assert plan(files=[upload], stale_upload_age=2 * HOUR).stale_uploads == (upload.path,)


def test_only_uploads_directly_under_the_prefix_with_the_pipelines_name_are_stale() -> None:
    files = [
        old_upload(prefix=f"{PREFIX}/nested-pool"),
        old_upload(prefix="agent-forge/ns/other"),
        old_upload(prefix="agent-forge/ns"),
        old_upload(name=".upload-1234.iso"),
        old_upload(name=UPLOAD + ".part"),
        old_upload(name=UPLOAD.upper()),
        old_upload(name="x" + UPLOAD),
    ]
    assert plan(history=[entry(3)], retain=1, files=files).stale_uploads == ()


def test_an_upload_something_holds_is_never_deleted() -> None:
    upload = old_upload()
    result = plan(files=[upload], in_use={upload.path})
    assert result.stale_uploads == ()
    assert plan(files=[upload], kept_elsewhere={upload.path}).stale_uploads == ()


def test_the_stale_age_comes_from_the_pipelines_timeouts_and_is_at_least_an_hour() -> None:
    assert IsoLimits().stale_upload_age == HOUR
    assert iso_cache.DEFAULT_STALE_UPLOAD_AGE == HOUR
    slow = IsoLimits(connect_timeout_seconds=60, read_timeout_seconds=900)
    assert slow.stale_upload_age == timedelta(seconds=10 * 960)


def test_a_sweep_is_due_once_per_stale_age() -> None:
    assert iso_cache.sweep_due(None, now=NOW, every=HOUR)
    assert not iso_cache.sweep_due(NOW - HOUR + timedelta(seconds=1), now=NOW, every=HOUR)
    assert iso_cache.sweep_due(NOW - HOUR, now=NOW, every=HOUR)


def test_backing_paths_are_compared_on_the_same_datastore_only() -> None:
    backing = f"[iso-ds] {path(1)}"
    assert iso_cache.relative_path(backing, datastore="iso-ds") == path(1)
    assert iso_cache.relative_path(backing, datastore="ds1") is None
    assert iso_cache.relative_path("not a backing", datastore="iso-ds") is None
