"""One task waiter per session: every in-flight vCenter task behind one filter.

Instead of one poll loop per task, the waiter keeps a private PropertyCollector with
a single filter over a `ListView`. Watching a task (or a VM's pending question) adds
it to the view; registrations from concurrent callers in the same loop tick are
coalesced into one `ModifyListView` that also drops finished objects. One long poll,
`WaitForUpdatesEx`, reports the changes of all of them. Every VM task is *followed*
(`follow`): its callback runs when the task ends, and nothing waits meanwhile; only
`run_task`'s datastore file tasks, which end within a request's time, are waited for
(`wait`).
Only `info.state`, `info.error` and `info.result` are read (the whole `info` trips a
simulator quirk and costs more). The long poll runs on its own thread, so it never
occupies the bounded call pool, and is not rate limited (it is one request per batch
of updates). It runs only while something is watched.

New members of the view are picked up by the next poll asking for the current state
(empty version); a poll already waiting is interrupted with `CancelWaitForUpdates`
(govmomi's simulator does not wake a waiting poll for ListView changes, and a task
that finished before it joined the view would otherwise be reported late).

A poll that ends with nothing new while objects are watched is normal (a task takes
longer than `wait_max_seconds`); `RESYNC_QUIET_POLLS` of them in a row rebuild the
collector, whose first poll reports the current state of everything watched, as an
informer relists. A change the long poll missed then costs at most that many polls,
not a wait forever (a vcsim CD-ROM test, in long runs of the whole suite only, waited
until its timeout for a change its polls, answered empty every 10 s, never reported;
the cause in the simulator was not found).

After a re-login the collector, view and filter are gone with the old session: the
waiter rebuilds them and re-registers everything still in flight. A task vCenter no
longer knows fails its waiters with `errors.NotFound`, never with success, and only
them: should vCenter refuse the whole view for it, the others are watched on.

Starting a task and reading how it ended: `run_task` and `task_outcome`.

`run_task` starts a vCenter task (restarting it while its fault is transient) and
waits for it through the session's one `tasks.TaskWaiter` (the datastore's file
tasks, which end within a request's time; every VM task is followed instead); `task_outcome` turns a
finished task's `info.state`/`info.error`/`info.result` into its result or its fault,
typed as every other error of this layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from agentforge.vsphere import faults
from agentforge.vsphere.model import errors
from agentforge.vsphere.tasks import view as task_view
from agentforge.vsphere.tasks.view import (
    QUESTION_PATH,
    TASK_PATHS,
    Ended,
    Seen,
    Watch,
    has_question,
    task_done,
)
from agentforge.vsphere.vmomi import vmodl

if TYPE_CHECKING:
    from agentforge.vsphere.tasks.view import TaskHost


log = logging.getLogger(__name__)

__all__ = ["QUESTION_PATH", "TASK_PATHS", "TaskWaiter", "run_task", "task_outcome"]

REMOVE_BATCH = 32
RESYNC_QUIET_POLLS = 2
"""Polls in a row that end with nothing new, while objects are watched, before the
collector is rebuilt and the current state read."""


class TaskWaiter:
    """Resolves futures for task completion and VM questions; owned by a `Session`."""

    def __init__(self, *, session: TaskHost) -> None:
        self._session = session
        self._watches: dict[str, Watch] = {}
        self._seen = Seen()
        self._props = self._seen.props  # last known properties of viewed objects
        self._finished = self._seen.finished  # tasks seen finished, still in view
        self._in_view: set[str] = set()
        self._to_add: dict[str, Any] = {}
        self._to_remove: dict[str, Any] = {}
        self._collector: task_view.Collector | None = None
        self._setup_lock = asyncio.Lock()
        self._flush_lock = asyncio.Lock()
        self._active = asyncio.Event()
        self._flush_wanted = asyncio.Event()
        self._poller: ThreadPoolExecutor | None = None
        self._runner: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._polling = False
        self._fresh = False
        self._closed = False
        self._quiet_polls = 0
        self.polls = 0
        self.resyncs = 0

    # --- public -----------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Something is being waited for (the session is in use)."""
        return bool(self._watches)

    async def wait(self, task: Any, *, subject: str, action: str) -> Any:
        """Wait for a task; return `info.result`, raise the typed `info.error`."""
        values = await self._watch(task, task_done, terminal=True)
        return task_outcome(values, subject=subject, action=action)

    def follow(self, ref: Any, *, token: str, ended: Ended, question: bool = False) -> None:
        """Call `ended` once the task ends (or, with `question`, once the VM `ref` shows
        a question), without waiting for it. One callback per `token` and object (a
        second `follow` replaces it); `unfollow` drops it. A task seen finished while
        still in the view is answered at once (on the next loop iteration)."""
        if self._closed:
            raise errors.VsphereError("vCenter session closed")
        key = ref._moId
        if not question and key in self._finished:
            values = dict(self._finished[key])
            asyncio.get_running_loop().call_soon(ended, values, None)
            return
        watch, existed = self._register(
            ref, has_question if question else task_done, terminal=not question
        )
        if existed and watch.done(self._props.get(key, {})):
            values = dict(self._props[key])
            asyncio.get_running_loop().call_soon(ended, values, None)
            if not watch.wanted:
                self._unwatch(key, watch)
            return
        watch.followers[token] = ended
        self._active.set()

    def finished(self, moid: str) -> dict[str, Any] | None:
        """The properties of a task this waiter saw end (no request): a finished task
        never changes again. The last `ENDED_KEPT` are kept."""
        return self._seen.ended_task(moid)

    def unfollow(self, moid: str, *, token: str) -> None:
        """Drop `token`'s callback on the object (nothing when there is none)."""
        watch = self._watches.get(moid)
        if watch is None or watch.followers.pop(token, None) is None:
            return
        if not watch.wanted:
            self._unwatch(moid, watch)

    async def close(self) -> None:
        self._closed = True
        collector = self._collector
        if self._polling and collector is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._session.run_blocking(collector.pc.CancelWaitForUpdates), timeout=5
                )
        for task in (self._runner, self._flusher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        watches = list(self._watches.values())
        self._watches.clear()
        for watch in watches:
            watch.fail(errors.VsphereError("vCenter session closed"))
        if self._poller is not None:
            self._poller.shutdown(wait=False, cancel_futures=True)

    # --- registration -----------------------------------------------------------

    async def _watch(
        self, ref: Any, done: Callable[[dict[str, Any]], bool], *, terminal: bool
    ) -> dict[str, Any]:
        """Register interest in `ref` until `done(props)`; share one watch per object.

        A finished task is remembered while it stays in the view, so waiting again costs
        nothing. A VM (whose properties keep changing) is removed from the view as soon
        as nobody watches it, and re-added for the next watcher, so a new watch always
        starts from vCenter's current state, never from a stale copy.
        """
        if self._closed:
            raise errors.VsphereError("vCenter session closed")
        key = ref._moId
        if terminal and key in self._finished:
            return dict(self._finished[key])
        watch, existed = self._register(ref, done, terminal=terminal)
        if existed and watch.done(self._props.get(key, {})):
            return dict(self._props[key])
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        watch.futures.append(fut)
        self._active.set()
        try:
            return await fut
        finally:
            if fut in watch.futures:
                watch.futures.remove(fut)
            if not watch.wanted and self._watches.get(key) is watch:
                self._unwatch(key, watch)

    def _register(
        self, ref: Any, done: Callable[[dict[str, Any]], bool], *, terminal: bool
    ) -> tuple[Watch, bool]:
        """The object's watch (and whether it existed), put into the view when new: a
        new watch never answers from properties seen before it (a VM's may be stale)."""
        key = ref._moId
        self.start()
        watch = self._watches.get(key)
        existed = watch is not None
        if watch is None:
            watch = Watch(ref=ref, done=done, terminal=terminal)
            self._watches[key] = watch
            if key not in self._in_view:
                self._to_add[key] = ref
                self._flush_wanted.set()
            elif key in self._to_remove:
                if terminal:
                    del self._to_remove[key]  # still in view: updates keep arriving
                else:
                    self._to_add[key] = ref  # flushed as remove, then add: a fresh state
                    self._flush_wanted.set()
        return watch, existed

    def _unwatch(self, key: str, watch: Watch) -> None:
        del self._watches[key]
        if key in self._to_add and key not in self._in_view:
            del self._to_add[key]
        elif key in self._in_view or key in self._to_add:
            self._to_remove[key] = watch.ref
            if not watch.terminal or len(self._to_remove) >= REMOVE_BATCH:
                # VMs go now so the next watch starts fresh; finished tasks go in batches
                # (or with the next registration), which keeps the view, and the work
                # vCenter does per update, small.
                self._flush_wanted.set()
        if not self._watches:
            self._active.clear()

    def start(self) -> None:
        """Start the (idle until needed) polling and registration tasks."""
        if self._runner is None:
            self._poller = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vsphere-wait")
            self._runner = asyncio.create_task(self._run(), name="vsphere task waiter")
            self._flusher = asyncio.create_task(self._flush_loop(), name="vsphere task register")

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            # Let registrations coalesce: one view change, one interrupted poll for many.
            await asyncio.sleep(self._session.options.task_batch_seconds)
            self._flush_wanted.clear()
            try:
                await self._flush()
            except errors.VsphereError as exc:
                log.warning("registering vCenter tasks failed, retried by the waiter: %s", exc)

    async def _flush(self) -> None:
        async with self._flush_lock:
            collector = await self._ensure_collector()
            add = dict(self._to_add)
            remove = dict(self._to_remove)
            if not add and not remove:
                return
            self._to_add.clear()
            self._to_remove.clear()
            try:
                if add.keys() & remove.keys():  # re-watched VMs: leave first, then enter anew
                    await self._modify(collector, add={}, remove=remove)
                    remove = {}
                missing = await self._modify(collector, add=add, remove=remove)
            except errors.VsphereError as exc:
                for key, ref in add.items():
                    self._to_add.setdefault(key, ref)
                for key, ref in remove.items():
                    if key not in self._watches:  # (a task watched again stays in view)
                        self._to_remove.setdefault(key, ref)
                # A refused list: drop the references vCenter no longer knows, retry the rest.
                if isinstance(exc, task_view.MEMBER_FAULTS) and await self._drop_gone(
                    [*add.values(), *remove.values()]
                ):
                    self._flush_wanted.set()
                    return
                raise
            for ref in missing:
                self._forget(ref._moId, task_view.gone_error(ref))
            if add:
                await self._refresh_poll(collector)

    async def _refresh_poll(self, collector: task_view.Collector) -> None:
        """Make the next poll report the objects just added, without waiting."""
        self._fresh = True
        if self._polling:
            await self._session.call(
                collector.pc.CancelWaitForUpdates,
                subject="task waiter",
                action="interrupt the long poll of",
            )

    async def _modify(
        self, collector: task_view.Collector, *, add: dict[str, Any], remove: dict[str, Any]
    ) -> list[Any]:
        missing = await task_view.modify(
            self._session, collector, add=list(add.values()), remove=list(remove.values())
        )
        self._in_view.update(add)
        self._in_view.difference_update(remove)
        for key in remove:
            self._props.pop(key, None)
            self._finished.pop(key, None)
        return missing

    async def _ensure_collector(self) -> task_view.Collector:
        async with self._setup_lock:
            current = self._collector
            if current is not None and current.generation == self._session.generation:
                return current
            self._to_add.clear()
            self._to_remove.clear()
            self._in_view.clear()
            self._props.clear()
            self._finished.clear()
            while True:
                refs = [w.ref for w in self._watches.values()]
                try:
                    collector = await task_view.build(self._session, refs)
                    break
                except task_view.MEMBER_FAULTS:
                    # One stale reference fails the whole list: drop it, build for the rest.
                    if not await self._drop_gone(refs):
                        raise
            self._in_view.update(r._moId for r in refs)
            self._collector = collector
            self._fresh = True
            return collector

    async def _drop_gone(self, refs: list[Any]) -> bool:
        """Fail the watchers of the references vCenter no longer knows; True if any."""
        try:
            gone = await task_view.gone(self._session, refs)
        except errors.VsphereError as exc:
            log.debug("could not tell which watched objects are gone: %s", exc)
            return False
        for ref in gone:
            log.info("vCenter no longer knows watched %s", task_view.describe(ref))
            self._forget(ref._moId, task_view.gone_error(ref))
        return bool(gone)

    # --- polling ----------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = self._session.options.retry_initial_seconds
        while True:
            await self._active.wait()
            generation = self._session.generation
            try:
                if self._to_add:
                    await self._flush()
                collector = await self._ensure_collector()
                options = vmodl.query.PropertyCollector.WaitOptions(
                    maxWaitSeconds=self._session.options.wait_max_seconds
                )
                # After registrations, ask for the current state ("" version): it reports
                # the new objects at once (a pending long poll may not wake for them).
                version = "" if self._fresh else collector.version
                self._fresh = False
                self._polling = True
                self.polls += 1
                self._session.touch()
                try:
                    updates = await loop.run_in_executor(
                        self._poller,
                        functools.partial(collector.pc.WaitForUpdatesEx, version, options),
                    )
                finally:
                    self._polling = False
                backoff = self._session.options.retry_initial_seconds
            except Exception as exc:  # noqa: BLE001 - classified below; the waiter must live on
                if self._closed:
                    return
                if isinstance(exc, vmodl.fault.RequestCanceled):
                    continue  # we cancelled it to pick up new registrations
                err = faults.classify(exc, subject="task waiter", action="wait for tasks in")
                if isinstance(err, errors.SessionExpired):
                    await self._relogin(generation)
                    continue
                if not isinstance(err, errors.TransientError):
                    self._collector = None  # rebuilt, over the objects vCenter still knows
                if isinstance(err, errors.NotFound) and await self._drop_gone(
                    [w.ref for w in self._watches.values()]  # was a watched object to blame?
                ):
                    continue
                log.warning("waiting for vCenter tasks failed, retrying: %s", err)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._session.options.retry_max_seconds)
                continue
            if updates is not None:
                self._quiet_polls = 0
                collector.version = updates.version
                self._apply(updates)
                # Let more updates gather before the next poll: one answer for many ends.
                await asyncio.sleep(self._session.options.task_batch_seconds)
            elif self._watches and version:
                self._quiet_polls += 1
                if self._quiet_polls >= RESYNC_QUIET_POLLS:
                    await self._resync(collector)

    async def _resync(self, collector: task_view.Collector) -> None:
        """Rebuild the collector: its first poll reports the current state of every
        watched object (what a missed update left unseen)."""
        async with self._flush_lock:
            if self._collector is not collector:
                return  # rebuilt meanwhile
            self._quiet_polls = 0
            self.resyncs += 1
            log.info(
                "task waiter: nothing new from vCenter for %d polls while %d object(s) are "
                "watched; reading their current state again",
                RESYNC_QUIET_POLLS,
                len(self._watches),
            )
            self._collector = None  # `_ensure_collector` rebuilds it over every watch
            await task_view.destroy(self._session, collector)

    async def _relogin(self, generation: int) -> None:
        try:
            await self._session.relogin(seen=generation)
        except errors.LoginPending:  # someone else's login runs on: poll again after it
            await asyncio.sleep(self._session.options.retry_max_seconds)
        except errors.VsphereError as exc:
            for key in list(self._watches):  # the old session's view is gone with it
                self._forget(key, exc)
            await asyncio.sleep(self._session.options.retry_max_seconds)

    def _apply(self, updates: Any) -> None:
        for key, values in self._seen.apply(updates):
            watch = self._watches.get(key)
            if watch is not None and watch.done(values):
                # Unregister first, not when the waiters resume: the poll loop must
                # see at once whether anything is still watched.
                self._unwatch(key, watch)
                watch.resolve(values)

    def _forget(self, key: str, exc: BaseException) -> None:
        """Fail the object's watchers and forget it now: no view change or rebuild may
        carry it again (vCenter does not know it, or the view went with the session)."""
        watch = self._watches.pop(key, None)
        for table in (self._to_add, self._to_remove, self._props, self._finished):
            table.pop(key, None)
        self._in_view.discard(key)
        if not self._watches:
            self._active.clear()
        if watch is not None:
            watch.fail(exc)


async def run_task(
    session: TaskHost,
    start: Callable[[], Any],
    *,
    subject: str,
    action: str,
) -> Any:
    """Start a task and wait for it; transient task faults restart it (tenacity)."""
    async for attempt in session.retrying():
        with attempt:
            task = await session.call(start, subject=subject, action=action)
            return await session.waiter.wait(task, subject=subject, action=action)
    raise AssertionError("unreachable")  # pragma: no cover


def task_outcome(props: dict[str, Any], *, subject: str, action: str) -> Any:
    """The result of a finished task, or its fault as a typed error."""
    if props.get("info.state") == "success":
        return props.get("info.result")
    fault = props.get("info.error")
    # pyVmomi deserializes LocalizedMethodFault as the fault itself (message in `msg`).
    inner = fault if isinstance(fault, BaseException) else getattr(fault, "fault", None)
    if isinstance(inner, BaseException):
        err = faults.classify(inner, subject=subject, action=action)
        return _raise(err)
    return _raise(errors.TaskFailed(f"{action} {subject} failed without a fault", subject=subject))


def _raise(err: errors.VsphereError) -> Any:
    raise err
