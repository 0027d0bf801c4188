"""The ISO digest covers exactly the bytes sent, even when the consumer stops pulling early.

aiohttp's PUT cancels the body generator once the datastore has answered, and a
datastore answers as soon as it holds Content-Length bytes: the hash of the last chunk
can still be queued on the executor then. The digest must wait for it (it used to be
read at once, naming the file after all but its last chunk).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from agentforge.vsphere import TransientError
from agentforge.vsphere.iso.upload import ChunkHasher

CHUNKS = [bytes([n]) * (64 * 1024 + n) for n in range(4)]


class LateStart(ThreadPoolExecutor):
    """Every job starts late, as on a busy machine where the worker is not scheduled."""

    def __init__(self, delay: float) -> None:
        super().__init__(max_workers=2)
        self.delay = delay

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def late() -> Any:
            time.sleep(self.delay)
            return fn(*args, **kwargs)

        return super().submit(late)


@pytest.fixture
def late_executor() -> Iterator[LateStart]:
    executor = LateStart(0.05)
    yield executor
    executor.shutdown(wait=True)


async def test_the_digest_waits_for_the_last_chunks_hash(late_executor: LateStart) -> None:
    asyncio.get_running_loop().set_default_executor(late_executor)
    hasher = ChunkHasher()
    for chunk in CHUNKS:
        await hasher.add(chunk)  # the last one's hash is still queued when add returns
    got = await hasher.hexdigest(expected_bytes=sum(map(len, CHUNKS)))
    assert got == hashlib.sha256(b"".join(CHUNKS)).hexdigest()


async def test_a_consumer_cancelled_mid_stream_loses_no_queued_hash(
    late_executor: LateStart,
) -> None:
    asyncio.get_running_loop().set_default_executor(late_executor)
    hasher = ChunkHasher()
    sent: list[bytes] = []
    enough = sum(map(len, CHUNKS[:2]))
    answered = asyncio.Event()

    async def body() -> Any:
        for chunk in CHUNKS:
            await hasher.add(chunk)
            sent.append(chunk)
            yield chunk

    async def put() -> None:  # a PUT that is answered once it holds `enough` bytes
        async for _ in body():
            if sum(map(len, sent)) >= enough:
                answered.set()
                await asyncio.sleep(3600)

    task = asyncio.create_task(put())
    await answered.wait()
    task.cancel()  # what aiohttp does to the body writer when the response has come
    with pytest.raises(asyncio.CancelledError):
        await task
    got = await hasher.hexdigest(expected_bytes=enough)
    assert got == hashlib.sha256(b"".join(CHUNKS[:2])).hexdigest()


async def test_a_digest_over_other_bytes_than_counted_is_refused() -> None:
    hasher = ChunkHasher()
    await hasher.add(b"abc")
    with pytest.raises(TransientError, match="covers 3 of 4 bytes"):
        await hasher.hexdigest(expected_bytes=4)


def test_hashing_runs_off_the_event_loop_thread() -> None:
    seen: list[int] = []
    hasher = ChunkHasher()
    original = hasher._update

    def spy(chunk: bytes) -> None:
        seen.append(threading.get_ident())
        original(chunk)

    hasher._update = spy  # type: ignore[method-assign]

    async def run() -> str:
        await hasher.add(b"x" * 4096)
        return await hasher.hexdigest(expected_bytes=4096)

    assert asyncio.run(run()) == hashlib.sha256(b"x" * 4096).hexdigest()
    assert seen
    assert seen[0] != threading.get_ident()
