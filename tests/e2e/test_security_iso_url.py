"""The image service's key in an ISO URL reaches no status, condition, Event, log or metric.

The InfraEnv's `isoDownloadURL` carries a signed JWT as the real image service's
does: first in the path (`/byapikey/<JWT>/4.14/x86_64/...`), then, with a new key,
in the query (`/images/<id>?api_key=<JWT>&...`), then a third key behind a URL that
answers 404. The operator (at debug level) caches the ISO, notices each new URL
(a new key behind the same shown URL too), reports the 404 in `ISOReady` and a
Warning Event naming the shown URL; no key appears in any object it writes or
reads other than the InfraEnv itself, in its log or on /metrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentforge.api import kinds, names
from agentforge.redaction import REDACTED, redact_url
from sim.operator import MetricsReader, OperatorProcess
from sim.world import DEFAULT_INFRAENV, Snapshot, World
from tests.e2e.support import eventually, pool_condition_is

POOL = "workers"
INFRAENV = DEFAULT_INFRAENV


def image_created(url: str) -> dict[str, Any]:
    condition = {
        "type": "ImageCreated",
        "status": "True",
        "reason": "ImageCreated",
        "message": "Image has been created",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    return {"isoDownloadURL": url, "conditions": [condition]}


def iso_status(snap: Snapshot) -> dict[str, Any]:
    return dict(snap.pool_status(POOL).get("iso") or {})


async def written_objects(world: World) -> dict[str, str]:
    """Everything the operator writes or reads, as JSON, but the InfraEnv: its status
    holds the full URL by design (the image service wrote it there)."""
    where = (
        (kinds.VSPHERE_AGENT_POOL, world.namespace),
        (kinds.VSPHERE_AGENT, world.namespace),
        (kinds.AGENT, world.namespace),
        (kinds.EVENT, world.namespace),
        (kinds.AGENT_MACHINE, world.control_plane_namespace),
        (kinds.EVENT, world.control_plane_namespace),
        (kinds.EVENT, names.DEPLOYMENT_NAMESPACE),
        (kinds.LEASE, names.DEPLOYMENT_NAMESPACE),
    )
    texts = {}
    for kind, namespace in where:
        listed = await world.client.list(kind, namespace=namespace)
        texts[f"{kind.plural} in {namespace}"] = json.dumps(listed.items)
    return texts


async def test_iso_url_keys_appear_in_no_status_condition_event_log_or_metric(
    world: World, operator_kubeconfig: Path, metrics_reader: MetricsReader, tmp_path: Path
) -> None:
    ns, server = world.namespace, world.iso_server
    image = server.publish(ns, INFRAENV)
    keys = [server.token(ns, INFRAENV) for _ in range(3)]
    path_url = server.url(ns, INFRAENV, auth="byapikey", token=keys[0])
    query_url = server.url(ns, INFRAENV, auth="query", token=keys[1])
    failing_url = server.url(ns, INFRAENV, auth="byapikey", token=keys[2])
    assert redact_url(path_url) == redact_url(failing_url), "a new key shows the same"

    await world.create_infraenv(INFRAENV, manual_status=image_created(path_url))
    await world.create_credentials()
    await world.create_pool(POOL, folder=f"e2e/{ns}")
    process = OperatorProcess(
        operator_kubeconfig,
        "--log-level",
        "debug",
        "--namespace",
        ns,
        "--namespace",
        world.control_plane_namespace,
        log_path=tmp_path / "operator.log",
        metrics=metrics_reader,
    )
    collected: dict[str, str] = {}
    try:
        process.start()
        await process.wait_ready(within=60)

        # The key in the path: cached, status shows the URL without it.
        snap = await eventually(
            world.snapshot,
            lambda s: iso_status(s).get("sha256") == image.sha256,
            within=90,
            what="the ISO behind the /byapikey/<JWT>/ URL cached",
        )
        shown = f"{server.base_url}/byapikey/{REDACTED}/4.14/x86_64/discovery.iso"
        assert iso_status(snap)["url"] == shown
        first_hash, first_path = iso_status(snap)["urlHash"], iso_status(snap)["path"]

        # A new key in the query: a new URL, noticed, and shown without its key.
        await world.client.patch_status(
            kinds.INFRA_ENV, namespace=ns, name=INFRAENV, patch={"status": image_created(query_url)}
        )
        snap = await eventually(
            world.snapshot,
            lambda s: iso_status(s).get("url") == redact_url(query_url),
            within=60,
            what="status.iso.url showing the query URL",
        )
        assert f"?api_key={REDACTED}&arch=x86_64" in iso_status(snap)["url"]
        assert iso_status(snap)["urlHash"] != first_hash
        assert iso_status(snap)["path"] == first_path, "the same image: the same file"

        # A third key behind a URL that answers 404: reported with the shown URL.
        server.fail(ns, INFRAENV, status=404)
        await world.client.patch_status(
            kinds.INFRA_ENV,
            namespace=ns,
            name=INFRAENV,
            patch={"status": image_created(failing_url)},
        )
        snap = await eventually(
            world.snapshot,
            lambda s: pool_condition_is(s, POOL, "ISOReady", "False", ("ISOCacheFailed",))
            and any(e.get("reason") == "ISOCacheFailed" for e in s.events_about(
                "VsphereAgentPool", POOL
            )),
            within=60,
            what="ISOReady=False, ISOCacheFailed, and its Warning Event",
        )  # fmt: skip
        (warning, *_) = [
            e
            for e in snap.events_about("VsphereAgentPool", POOL)
            if e["reason"] == "ISOCacheFailed"
        ]
        assert f"the ISO source {shown} answered HTTP 404" in warning["message"]
        assert server.stats(ns, INFRAENV).errors >= 1

        collected = {
            "operator log": process.log_text(),
            "metrics": await process.metrics_text(),
            **await written_objects(world),
        }
    finally:
        await process.stop()
    collected["operator log"] = process.log_text()
    assert "answered HTTP 404" in collected["operator log"], "the failure was logged"
    leaks = [
        f"{label}: key {i} ({part})"
        for i, key in enumerate(keys)
        for part, text_part in zip(
            ("whole", "signature"), (key, key.rsplit(".", 1)[1]), strict=True
        )
        for label, text in collected.items()
        if text_part in text
    ]
    assert leaks == []
