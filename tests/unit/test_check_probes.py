"""`agentforge check` probes without a cluster: ISO URL over loopback HTTP, Secret texts,
RBAC review decisions against a fake API."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from agentforge.api import names
from agentforge.api.pool import VsphereAgentPool
from agentforge.check import probes as check_probes
from agentforge.check import rbac as check_rbac
from agentforge.check.render import Status
from agentforge.kube import errors as kube_errors
from agentforge.kube.client import ListResult
from agentforge.secret_credentials import CredentialsError, parse_credentials


def pool(**vsphere: Any) -> VsphereAgentPool:
    spec_vsphere = {
        "credentialsSecretRef": {"name": "creds", "namespace": vsphere.pop("secret_ns", None)},
        "datastoreCluster": "dsc1",
        "isoDatastore": "iso-ds",
        "resourcePool": "cluster/Resources",
        "network": "VM Network",
        **vsphere,
    }
    return VsphereAgentPool.model_validate(
        {
            "metadata": {"name": "workers", "namespace": "team-a"},
            "spec": {
                "hostedClusterRef": {"name": "hc1"},
                "nodePoolRef": {"name": "workers"},
                "infraEnvRef": {"name": "discovery"},
                "controlPlaneNamespace": "clusters-hc1",
                "vsphere": spec_vsphere,
                "template": {},
                "agent": {"labels": {"a": "b"}},
            },
        }
    )


# --- spec ---------------------------------------------------------------------------------


def test_spec_item_shows_effective_defaults_and_unsupported_values() -> None:
    item = check_probes.spec_item(pool())
    assert item.status is Status.PASS
    assert item.message == (
        "spec valid; VMs hc1-worker-* in folder hc1, ISOs in [iso-ds] agent-forge/team-a/workers"
    )
    bad = check_probes.spec_item(pool(scsiType="ide9"))
    assert bad.status is Status.FAIL
    assert bad.message == "spec.vsphere.scsiType 'ide9' is not supported"
    assert bad.fix.startswith("use one of ")


# --- ISO URL ------------------------------------------------------------------------------

Handler = Callable[[web.Request], Any]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Any]]:
    runners: list[web.AppRunner] = []
    seen: list[web.Request] = []

    async def start(handler: Handler) -> str:
        async def record(request: web.Request) -> web.StreamResponse:
            seen.append(request)
            response: web.StreamResponse = await handler(request)
            return response

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", record)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://user:pw@127.0.0.1:{port}/images/x.iso?api_key=SECRET-KEY&arch=x86_64"

    start.seen = seen  # type: ignore[attr-defined]
    yield start
    for runner in runners:
        await runner.cleanup()


async def test_head_answer_reports_status_and_size(serve: Any) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"x" * 3 * 1024 * 1024)

    url = await serve(handler)
    item = await check_probes.iso_url(url)
    assert item.status is Status.PASS
    assert item.message == "HTTP 200, 3.0 MiB (3145728 bytes)"
    assert "SECRET-KEY" not in item.subject
    shown = url.replace("user:pw@", "[REDACTED]@").replace("SECRET-KEY", "[REDACTED]")
    assert item.subject == f"ISO URL {shown}"
    assert [r.method for r in serve.seen] == ["HEAD"]


async def test_refused_head_falls_back_to_a_one_byte_range(serve: Any) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.method == "HEAD":
            return web.Response(status=405)
        assert request.headers["Range"] == "bytes=0-0"
        return web.Response(
            status=206, body=b"x", headers={"Content-Range": "bytes 0-0/1073741824"}
        )

    item = await check_probes.iso_url(await serve(handler))
    assert item.status is Status.PASS
    assert item.message == "HTTP 206, 1.0 GiB (1073741824 bytes)"
    assert [r.method for r in serve.seen] == ["HEAD", "GET"]


async def test_not_found_fails_naming_the_status(serve: Any) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=404)

    item = await check_probes.iso_url(await serve(handler))
    assert item.status is Status.FAIL
    assert item.message == "answers HTTP 404"
    assert item.fix
    assert [r.method for r in serve.seen] == ["HEAD"]


async def test_an_unreachable_url_fails_without_its_query() -> None:
    item = await check_probes.iso_url("http://127.0.0.1:1/x.iso?api_key=SECRET-KEY")
    assert item.status is Status.FAIL
    assert item.message.startswith("did not answer")
    assert "SECRET-KEY" not in item.message + item.subject


JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhYmMifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://h.example/i.iso", "https://h.example/i.iso"),
        (
            "https://u:p@h.example:8443/i.iso?api_key=k#f",
            "https://[REDACTED]@h.example:8443/i.iso?api_key=[REDACTED]#f",
        ),
        ("http://[::1]:80/i.iso", "http://[::1]:80/i.iso"),
        (
            f"https://images.example/byapikey/{JWT}/4.14/x86_64/minimal.iso",
            "https://images.example/byapikey/[REDACTED]/4.14/x86_64/minimal.iso",
        ),
    ],
)
def test_iso_urls_are_shown_as_the_operator_shows_them(url: str, shown: str) -> None:
    assert check_probes.redact_url(url) == shown


async def test_an_error_quoting_the_url_shows_it_redacted() -> None:
    url = f"https://images.example/byapikey/{JWT}/4.14/x86_64/minimal.iso?token=abc"
    text = check_probes._scrub(f"Cannot connect to {url} (password=hunter2)", url)
    assert JWT not in text
    assert "abc" not in text
    assert "hunter2" not in text
    assert "https://images.example/byapikey/[REDACTED]/4.14/x86_64/minimal.iso" in text


@pytest.mark.parametrize(
    ("size", "text"),
    [(None, "size not announced"), (512, "512 bytes"), (1536, "1.5 KiB (1536 bytes)")],
)
def test_human_size(size: int | None, text: str) -> None:
    assert check_probes.human_size(size) == text


# --- Secret -------------------------------------------------------------------------------


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("data", "problem", "fix_start"),
    [
        ({"server": "vc", "username": "u"}, "has no key 'password' (or it is empty)", "add it"),
        (
            {"server": "vc", "username": "u", "password": "hunter2", "insecure": "maybe"},
            "key 'insecure' must be true or false",
            "fix the value",
        ),
    ],
)
def test_credential_errors_split_into_problem_and_fix(
    data: dict[str, str], problem: str, fix_start: str
) -> None:
    with pytest.raises(CredentialsError) as raised:
        parse_credentials(namespace="ns", name="creds", data={k: b64(v) for k, v in data.items()})
    message, fix = check_probes._problem_and_fix(
        str(raised.value), prefix="vSphere credentials Secret ns/creds"
    )
    assert message == problem
    assert fix.startswith(fix_start)
    assert "hunter2" not in message + fix


# --- RBAC -------------------------------------------------------------------------------


class FakeApi:
    """Answers access reviews: `may_review` for SubjectAccessReview creation, `allowed`
    for everything else (by resource)."""

    def __init__(self, *, may_review: bool, denied: frozenset[str] = frozenset()) -> None:
        self.may_review = may_review
        self.denied = denied
        self.bodies: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        body = kwargs["body"]
        self.bodies.append(body)
        attributes = body["spec"]["resourceAttributes"]
        if attributes["resource"] == "subjectaccessreviews":
            return {"status": {"allowed": self.may_review}}
        return {"status": {"allowed": attributes["resource"] not in self.denied}}


async def test_the_operators_serviceaccount_is_reviewed_when_the_caller_may() -> None:
    api = FakeApi(may_review=True, denied=frozenset({"agentmachines"}))
    reviewer = await check_rbac.Reviewer.create(api, None)  # type: ignore[arg-type]
    items = await reviewer.review(pool(secret_ns="vault"))
    by_subject = {i.subject.rsplit(" ", 1)[-1]: i for i in items if "reconciling" in i.subject}
    assert set(by_subject) == {"team-a", "clusters-hc1", "cluster-wide"}
    (reading,) = [i for i in items if "reading credentials" in i.subject]
    by_subject["vault"] = reading
    assert by_subject["cluster-wide"].status is Status.PASS  # the reviews behind /metrics
    assert by_subject["cluster-wide"].message == "all 2 permissions granted"
    assert by_subject["team-a"].status is Status.FAIL
    assert by_subject["team-a"].message == (
        "denied: agentmachines.capi-provider.agent-install.openshift.io [list, patch, watch]"
    )
    sa = f"{names.DEPLOYMENT_NAMESPACE}:{names.SERVICE_ACCOUNT}"
    assert f"--serviceaccount={sa}" in by_subject["team-a"].fix
    assert by_subject["vault"].status is Status.PASS
    assert by_subject["vault"].message == "all 1 permission granted"  # secrets: get
    (leader,) = [i for i in items if "leader election" in i.subject]
    assert leader.subject.endswith(f"in namespace {names.DEPLOYMENT_NAMESPACE}")
    reviews = [b for b in api.bodies if b["kind"] == "SubjectAccessReview"]
    assert {b["spec"]["user"] for b in reviews} == {
        f"system:serviceaccount:{names.DEPLOYMENT_NAMESPACE}:{names.SERVICE_ACCOUNT}"
    }
    secret_namespaces = {
        b["spec"]["resourceAttributes"]["namespace"]
        for b in reviews
        if b["spec"]["resourceAttributes"]["resource"] == "secrets"
    }
    assert secret_namespaces == {"vault"}

    before = len(api.bodies)
    await reviewer.review(pool(secret_ns="vault"))
    assert len(api.bodies) == before, "answers are cached across pools"


async def test_without_review_rights_the_callers_own_permissions_are_reviewed() -> None:
    api = FakeApi(may_review=False)
    reviewer = await check_rbac.Reviewer.create(api, None)  # type: ignore[arg-type]
    items = await reviewer.review(pool())
    assert items[0].status is Status.WARN
    assert "reviewing your own permissions" in items[0].message
    # Your own permissions lack what the operator needs to authorise /metrics callers
    # (you may not create SubjectAccessReviews: that is why yours are reviewed).
    (cluster,) = [i for i in items if i.subject.endswith("cluster-wide")]
    assert cluster.status is Status.FAIL
    assert cluster.message == "denied: subjectaccessreviews.authorization.k8s.io [create]"
    assert all(i.status is Status.PASS for i in items[1:] if i is not cluster)
    assert {b["kind"] for b in api.bodies} == {"SelfSubjectAccessReview"}
    assert (await reviewer.review(pool()))[0].status is Status.WARN, "shown with each pool"


async def test_a_named_serviceaccount_needs_review_rights() -> None:
    reviewer = await check_rbac.Reviewer.create(
        FakeApi(may_review=False),  # type: ignore[arg-type]
        "ns/robot",
    )
    (item,) = await reviewer.review(pool())
    assert item.status is Status.FAIL
    assert item.subject == "ServiceAccount ns/robot"
    assert "may not create SubjectAccessReviews" in item.message


# --- Kubernetes objects -----------------------------------------------------------------


class FakeKube:
    """`get` and `list` over a dict of objects; kinds in `missing_kinds` answer 404 as an
    API server without that CRD does (no `details.name`)."""

    def __init__(self, *objects: dict[str, Any], missing_kinds: tuple[str, ...] = ()) -> None:
        self.objects = objects
        self.missing_kinds = missing_kinds

    def _of(self, kind: Any, namespace: str | None) -> list[dict[str, Any]]:
        if kind.kind in self.missing_kinds:
            raise kube_errors.NotFound(status=404, reason="NotFound", message="no such resource")
        return [
            o
            for o in self.objects
            if o["kind"] == kind.kind and o["metadata"].get("namespace") == namespace
        ]

    async def get(self, kind: Any, *, namespace: str | None = None, name: str) -> dict[str, Any]:
        for obj in self._of(kind, namespace):
            if obj["metadata"]["name"] == name:
                return obj
        raise kube_errors.NotFound(
            status=404, reason="NotFound", message=f"{name} not found", details={"name": name}
        )

    async def list(self, kind: Any, *, namespace: str | None = None) -> ListResult:
        return ListResult(items=self._of(kind, namespace), resource_version="1")


def obj(kind: str, name: str, namespace: str | None = "team-a", **rest: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "namespace": namespace}, **rest}


def image_created(status: str) -> dict[str, Any]:
    return {
        "isoDownloadURL": "https://images.example/x.iso?api_key=K",
        "conditions": [{"type": "ImageCreated", "status": status}],
    }


async def test_infraenv_missing_object_and_missing_api_differ() -> None:
    item, url = await check_probes.infraenv(FakeKube(), pool())  # type: ignore[arg-type]
    assert (item.status, item.message, url) == (Status.FAIL, "not found", None)
    api_missing = FakeKube(missing_kinds=("InfraEnv",))
    item, _ = await check_probes.infraenv(api_missing, pool())  # type: ignore[arg-type]
    assert item.message == "the InfraEnv API is not installed"


async def test_infraenv_without_image_created_warns_and_still_gives_the_url() -> None:
    kube = FakeKube(obj("InfraEnv", "discovery", status=image_created("False")))
    item, url = await check_probes.infraenv(kube, pool())  # type: ignore[arg-type]
    assert item.status is Status.WARN
    assert url == "https://images.example/x.iso?api_key=K"
    assert "api_key=K" not in item.message
    kube = FakeKube(obj("InfraEnv", "discovery", status=image_created("True")))
    item, _ = await check_probes.infraenv(kube, pool())  # type: ignore[arg-type]
    assert item.message == "ImageCreated=True, ISO https://images.example/x.iso?api_key=[REDACTED]"


async def test_secret_keys_are_named_values_never_and_insecure_warns() -> None:
    data = {"server": "vc.example:443", "username": "u", "password": "hunter2", "insecure": "true"}
    kube = FakeKube(obj("Secret", "creds", data={k: b64(v) for k, v in data.items()}))
    items, credentials = await check_probes.secret(kube, pool())  # type: ignore[arg-type]
    assert credentials is not None
    assert [i.status for i in items] == [Status.PASS, Status.WARN]
    assert items[0].message == "keys server, username, password, insecure; vCenter vc.example:443"
    assert all("hunter2" not in i.message + i.fix for i in items)
    items, credentials = await check_probes.secret(FakeKube(), pool())  # type: ignore[arg-type]
    assert (items[0].status, items[0].message, credentials) == (Status.FAIL, "not found", None)
    skipped = await check_probes.vsphere_preflight(None, pool(), None)  # type: ignore[arg-type]
    assert [i.status for i in skipped] == [Status.SKIP]


class ForbiddenKube(FakeKube):
    async def get(self, kind: Any, *, namespace: str | None = None, name: str) -> dict[str, Any]:
        raise kube_errors.Forbidden(status=403, reason="Forbidden", message="forbidden")


def vault_secret(annotation: str | None, **keys: str) -> dict[str, Any]:
    data = {"server": "vc.example", "username": "u", "password": "hunter2", **keys}
    found = obj("Secret", "creds", "vault", data={k: b64(v) for k, v in data.items() if v})
    if annotation is not None:
        found["metadata"]["annotations"] = {names.ANNOTATION_ALLOWED_NAMESPACES: annotation}
    return found


async def test_a_secret_in_another_namespace_must_list_the_pools_namespace() -> None:
    kube = FakeKube(vault_secret(None))
    items, credentials = await check_probes.secret(kube, pool(secret_ns="vault"))  # type: ignore[arg-type]
    assert credentials is None
    (item,) = items
    assert item.status is Status.FAIL
    assert "does not list team-a: the operator refuses it" in item.message
    assert "CredentialsNotShared" in item.message
    assert "whoever manages namespace vault" in item.fix
    assert f"{names.ANNOTATION_ALLOWED_NAMESPACES}=<names already listed>,team-a" in item.fix

    kube = FakeKube(vault_secret("team-b, team-a"))
    items, credentials = await check_probes.secret(kube, pool(secret_ns="vault"))  # type: ignore[arg-type]
    assert credentials is not None
    assert [i.status for i in items] == [Status.PASS]
    assert items[0].message.startswith("shared with namespace team-a")


async def test_a_wildcard_is_no_namespace_and_is_flagged() -> None:
    kube = FakeKube(vault_secret("*"))
    items, credentials = await check_probes.secret(kube, pool(secret_ns="vault"))  # type: ignore[arg-type]
    assert credentials is None
    assert [i.status for i in items] == [Status.WARN, Status.FAIL]
    assert "'*'" in items[0].message
    assert "no wildcard" in items[0].message


async def test_once_shared_a_missing_key_is_named() -> None:
    kube = FakeKube(vault_secret("team-a", password=""))
    items, _ = await check_probes.secret(kube, pool(secret_ns="vault"))  # type: ignore[arg-type]
    assert [(i.status, i.message) for i in items] == [
        (Status.FAIL, "has no key 'password' (or it is empty)")
    ]


async def test_another_namespaces_secret_the_caller_may_not_read_is_unverifiable() -> None:
    items, credentials = await check_probes.secret(ForbiddenKube(), pool(secret_ns="vault"))  # type: ignore[arg-type]
    assert credentials is None
    assert items[0].status is Status.FAIL
    assert items[0].message.startswith("you may not read it")
    assert "ask whoever manages namespace vault" in items[0].fix
    items, _ = await check_probes.secret(FakeKube(), pool(secret_ns="vault"))  # type: ignore[arg-type]
    assert items[0].message.startswith("not found (and a Secret in another namespace")
    own, _ = await check_probes.secret(ForbiddenKube(), pool())  # type: ignore[arg-type]
    assert own[0].message.startswith("could not be read")


def agent_machine(name: str, nodepool: str, *, waiting: bool) -> dict[str, Any]:
    am = obj("AgentMachine", name, "clusters-hc1")
    am["metadata"]["annotations"] = {names.ANNOTATION_NODEPOOL: nodepool}
    reason = "NoSuitableAgents" if waiting else "Other"
    am["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": reason}]}
    return am


def pool_obj(name: str, nodepool: str) -> dict[str, Any]:
    return obj(
        "VsphereAgentPool",
        name,
        spec={"controlPlaneNamespace": "clusters-hc1", "nodePoolRef": {"name": nodepool}},
    )


async def test_demand_counts_the_pools_agent_machines_and_finds_twin_pools() -> None:
    kube = FakeKube(
        obj("Namespace", "clusters-hc1", None),
        agent_machine("am-1", "team-a/workers", waiting=True),
        agent_machine("am-2", "team-a/workers", waiting=False),
        agent_machine("am-3", "team-a/infra", waiting=True),
        pool_obj("workers", "workers"),
        pool_obj("twin", "workers"),
        pool_obj("infra", "infra"),
    )
    machines, nodepool = await check_probes.demand(kube, pool())  # type: ignore[arg-type]
    assert machines.status is Status.PASS
    assert machines.message == (
        "2 carry hypershift.openshift.io/nodePool=team-a/workers "
        "(1 waiting for an Agent, 2 without an Agent)"
    )
    assert nodepool.status is Status.FAIL
    assert nodepool.message.startswith("also served by VsphereAgentPool team-a/twin")


async def test_demand_without_agent_machines_warns_and_names_the_nodepools_seen() -> None:
    kube = FakeKube(
        obj("Namespace", "clusters-hc1", None), agent_machine("am-3", "team-a/infra", waiting=True)
    )
    machines, nodepool = await check_probes.demand(kube, pool())  # type: ignore[arg-type]
    assert machines.status is Status.WARN
    assert machines.message.endswith("there are AgentMachines of team-a/infra")
    assert nodepool.status is Status.PASS
    (missing,) = await check_probes.demand(FakeKube(), pool())  # type: ignore[arg-type]
    assert (missing.subject, missing.message) == ("Namespace clusters-hc1", "does not exist")


async def test_the_iso_url_is_probed_as_the_operator_downloads(tmp_path: Any) -> None:
    """A private CA fails until --iso-ca-bundle names it; a redirect to http fails."""
    import ssl  # noqa: PLC0415

    from agentforge import vsphere  # noqa: PLC0415
    from sim.actors.isoserver import IsoServer  # noqa: PLC0415
    from sim.controlplane import pki  # noqa: PLC0415

    ca = pki.new_ca(tmp_path / "ca")
    pair = pki.issue_serving_pair(ca, tmp_path / "tls", common_name="images")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.cert, pair.key)
    async with IsoServer(size=64 * 1024, ssl_context=context) as secure, IsoServer() as plain:
        secure.publish("ns", "ie")
        url = secure.url("ns", "ie")
        untrusted = await check_probes.iso_url(url)
        assert untrusted.status is Status.FAIL
        assert untrusted.message.startswith("TLS verification failed")
        assert "--iso-ca-bundle" in untrusted.fix
        access = vsphere.IsoAccess(ca_bundle=vsphere.CaBundleFile(ca.cert))
        trusted = await check_probes.iso_url(url, access=access)
        assert (trusted.status, trusted.message) == (
            Status.PASS,
            "HTTP 200, 64.0 KiB (65536 bytes)",
        )
        secure.redirect("ns", "ie", tag="old", to=plain.url("ns", "ie"))
        refused = await check_probes.iso_url(secure.url("ns", "ie", tag="old"), access=access)
        assert refused.status is Status.FAIL
        assert "only redirects to https are followed" in refused.message
        assert plain.stats().requests == 0


async def test_a_denied_secret_is_fixed_by_a_rolebinding_in_its_namespace_only() -> None:
    api = FakeApi(may_review=True, denied=frozenset({"secrets"}))
    reviewer = await check_rbac.Reviewer.create(api, None)  # type: ignore[arg-type]
    items = await reviewer.review(pool(secret_ns="vault"))
    (reading,) = [i for i in items if "reading credentials" in i.subject]
    assert reading.status is Status.FAIL
    assert reading.subject.endswith("in namespace vault")
    assert reading.message == "denied: secrets [get]"
    assert reading.fix.startswith(
        f"kubectl -n vault create rolebinding {names.CREDENTIALS_READER_ROLE} "
        f"--clusterrole={names.CREDENTIALS_READER_ROLE} "
    )
    assert "clusterrolebinding" not in reading.fix
