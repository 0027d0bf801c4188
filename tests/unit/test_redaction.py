"""Redaction is exact both ways: every credential shape goes, every ordinary message stays.

The ordinary messages are the operator's own, produced by its code where a function
makes them (credentials parsing, vSphere error classification, the ISO check reasons)
and copied from the source otherwise, with object names ending in the words that used
to trip the old rules (`-token`, `-secret`, `-credentials`, `-password`). The leaks
are real shapes: image service URLs (key in the path, key in the query), aiohttp's
error text quoting a URL, headers, Secret-like key/value text, JWTs, PEM keys.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import string
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from agentforge import observability, redaction
from agentforge.api import conditions
from agentforge.kube import events
from agentforge.reconcilers.infra.iso_cache import CheckReason
from agentforge.redaction import REDACTED, redact, redact_url
from agentforge.secret_credentials import CredentialsError, parse_credentials
from agentforge.settings import LogFormat, LogLevel
from agentforge.vsphere import faults
from agentforge.vsphere.vmomi import vim

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJpbmZyYV9lbnZfaWQiOiI3ZDQ2MThhZi1kMzY3LTRjNDctYWIzZi00OWUwODIyYTRjZjcifQ."
    "jl-HvaxBR-WX73vpxO-Fy65bmY-RE5iL6AqL0wbWCmE"
)
INFRA_ENV_ID = "7d4618af-d367-4c47-ab3f-49e0822a4cf7"
TRICKY_NAMES = ("x", "db-token", "secret", "vsphere-credentials", "api-key", "password", "token")


# --- the shown form of a URL --------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            f"https://images.example/byapikey/{JWT}/4.14/x86_64/minimal.iso",
            "https://images.example/byapikey/[REDACTED]/4.14/x86_64/minimal.iso",
        ),
        (
            f"https://images.example/images/{INFRA_ENV_ID}?api_key={JWT}&arch=x86_64"
            "&type=minimal-iso&version=4.14",
            f"https://images.example/images/{INFRA_ENV_ID}?api_key=[REDACTED]&arch=x86_64"
            "&type=minimal-iso&version=4.14",
        ),
        (
            "https://api.openshift.com/api/assisted-images/bytoken/tokenval/4.19/x86_64/full.iso",
            "https://api.openshift.com/api/assisted-images/bytoken/[REDACTED]/4.19/x86_64/full.iso",
        ),
        (
            f"https://images.example/images/{INFRA_ENV_ID}?image_token=abc&version=4.14",
            f"https://images.example/images/{INFRA_ENV_ID}?image_token=[REDACTED]&version=4.14",
        ),
        (f"http://h:8080/x/{JWT}/i.iso", "http://h:8080/x/[REDACTED]/i.iso"),
        ("https://u:p@h.example:8443/i.iso#f", "https://[REDACTED]@h.example:8443/i.iso#f"),
        ("http://[::1]:80/i.iso?arch=x86_64", "http://[::1]:80/i.iso?arch=x86_64"),
        (
            "https://s3.example/b/o.iso?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=0a1b&v=1",
            "https://s3.example/b/o.iso?X-Amz-Credential=[REDACTED]&X-Amz-Signature=[REDACTED]&v=1",
        ),
        (
            "https://blob.example/c/o.iso?sv=2022-11-02&sig=AbC%2Bd&se=2026-01-01",
            "https://blob.example/c/o.iso?sv=2022-11-02&sig=[REDACTED]&se=2026-01-01",
        ),
        # a long random value is a credential whatever its name; versions and ids are not
        (
            "https://h/i.iso?x=Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4MTIzNDU2&v=4.14.0-0.nightly-2026-01-01",
            "https://h/i.iso?x=[REDACTED]&v=4.14.0-0.nightly-2026-01-01",
        ),
        (f"https://h/i.iso?id={INFRA_ENV_ID}", f"https://h/i.iso?id={INFRA_ENV_ID}"),
        (
            "https://h/i.iso#access_token=abc&state=1",
            "https://h/i.iso#access_token=[REDACTED]&state=1",
        ),
        ("https://h/a;jsessionid=0AB1/i.iso", "https://h/a;jsessionid=[REDACTED]/i.iso"),
        (
            "https://ghp_0123456789abcdefABCDEF0123456789abcd@git.example/r.git",
            "https://[REDACTED]@git.example/r.git",
        ),
        ("https://git@git.example/r.git", "https://[REDACTED]@git.example/r.git"),
        ("not a url at all", "not a url at all"),
    ],
)
def test_the_shown_url_keeps_host_and_path_and_hides_credentials(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(shown) == shown


# The shapes a review found a short token surviving in, each with where it must go.
SHORT = "T0k"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"https://h/byapikey//{SHORT}/x.iso", "https://h/byapikey//[REDACTED]/x.iso"),
        (f"https://h/%62yapikey/{SHORT}/x.iso", "https://h/%62yapikey/[REDACTED]/x.iso"),
        (f"https://h/BY%41PIKEY/{SHORT}/x.iso", "https://h/BY%41PIKEY/[REDACTED]/x.iso"),
        (f"https://h/byapikey;v=1/{SHORT}/x.iso", "https://h/byapikey;v=1/[REDACTED]/x.iso"),
        (f"https://h/byapikey/./{SHORT}/x.iso", "https://h/byapikey/./[REDACTED]/x.iso"),
        (f"https://h/i.iso?a=x;api_key={SHORT}", "https://h/i.iso?a=x;api_key=[REDACTED]"),
        (f"https://u:p/{SHORT}@h/i.iso", "https://[REDACTED]@h/i.iso"),
        (f"https://u:p#{SHORT}@h/i.iso", "https://[REDACTED]@h/i.iso"),
        (f"https://u:p?{SHORT}@h:8443/i.iso", "https://[REDACTED]@h:8443/i.iso"),
        (f"https://{SHORT}@host/i.iso", "https://[REDACTED]@host/i.iso"),
        (f"https://h\\byapikey\\{SHORT}\\x.iso", "https://h\\byapikey\\[REDACTED]\\x.iso"),
        (f"https:\\\\h\\bytoken\\{SHORT}\\x.iso", "https:\\\\h\\bytoken\\[REDACTED]\\x.iso"),
        (f"https://u:p\\{SHORT}@h/x.iso", "https://[REDACTED]@h/x.iso"),
        (f"/byapikey/{SHORT}/x.iso", "/byapikey/[REDACTED]/x.iso"),
    ],
)
def test_a_short_token_in_every_shape_found_is_redacted(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact(f"GET {url} failed") == f"GET {shown} failed"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"Location: /byapikey/{SHORT}/x.iso", "Location: /byapikey/[REDACTED]/x.iso"),
        (f"<password>{SHORT}</password>", "<password>[REDACTED]</password>"),
        (
            f'<ns:Password a="1">{SHORT}</ns:Password>',
            '<ns:Password a="1">[REDACTED]</ns:Password>',
        ),
        (f"pwd={SHORT} user=admin", "pwd=[REDACTED] user=admin"),
        (
            f"kubectl create secret generic c --from-literal=password={SHORT}",
            "kubectl create secret generic c --from-literal=password=[REDACTED]",
        ),
        # a rule that must guess redacts: nothing tells "not" from a password
        ("secret: not found", "secret: [REDACTED] found"),
        ("password: hunter2", "password: [REDACTED]"),
    ],
)
def test_a_credential_in_text_is_redacted_where_the_rule_must_guess_too(
    text: str, shown: str
) -> None:
    assert redact(text) == shown
    assert redact(shown) == shown


def test_two_keys_show_alike_and_two_images_do_not() -> None:
    one = redact_url(f"https://images.example/byapikey/{JWT}/4.14/x86_64/minimal.iso")
    other_key = redact_url(f"https://images.example/byapikey/{JWT[:-3]}xyz/4.14/x86_64/minimal.iso")
    other_version = redact_url(f"https://images.example/byapikey/{JWT}/4.15/x86_64/minimal.iso")
    assert one == other_key
    assert one != other_version


# --- ordinary messages survive ------------------------------------------------------------


def _credential_errors(name: str) -> list[str]:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    good = {"server": b64("vc.example"), "username": b64("admin"), "password": b64("pw")}
    broken = [
        {k: v for k, v in good.items() if k != "password"},
        {k: v for k, v in good.items() if k != "username"},
        {**good, "insecure": b64("maybe")},
        {**good, "password": "%%%"},
        {**good, "server": b64("https://vc.example:notaport")},
        {**good, "caBundle": b64("not a certificate")},
    ]
    messages = []
    for data in broken:
        with pytest.raises(CredentialsError) as caught:
            parse_credentials(namespace="demo", name=name, data=data)
        messages.append(str(caught.value))
    return messages


def _ordinary_messages() -> list[str]:
    messages = [
        "no ISO is cached yet",
        "object demo/db-token: not found",
        "Secret demo/vsphere-credentials: key 'password' missing",
        "token bucket",
        "credentials Secret demo/x",
        # ratelimit.py, kube/config.py, vsphere/vm/tags.py
        "a token bucket needs rate > 0 and burst >= 1",
        "token file /var/run/secrets/kubernetes.io/serviceaccount/token is empty",
        "vAPI session for administrator@vsphere.local@vc.example:443 returned no token",
        # vsphere/service.py, reconcilers/infra/reconcile.py, kube/transport.py
        "check username and password in the credentials Secret",
        "add the vCenter CA bundle to the credentials Secret",
        "vCenter vc.example:443 reachable as administrator@vsphere.local; datacenter dc1",
        "TLS verification of https://10.0.0.1:6443 is disabled by configuration",
        # check_probes.py
        "kubectl -n demo create secret generic vsphere-credentials --from-literal=server=... "
        "--from-literal=username=... --from-literal=password=..., "
        "or fix spec.vsphere.credentialsSecretRef",
        "fix the Secret's keys: server, username, password (insecure, caBundle)",
        "not checked: no usable credentials Secret",
        # reconcilers/infra/iso_cache.py through infra_iso's log line, and an ISO path
        *(
            f"checking the ISO of pool demo/{name}: {reason.value}"
            for name in TRICKY_NAMES
            for reason in CheckReason
        ),
        "ISO [iso-ds] agent-forge/demo/db-token/0f343b0931126a20f133d67c2b018a3b5f2eb4e1ba1aa2"
        "fa6b76c8ae9e25d4b3.iso cached (1048576 bytes)",
        # vsphere/errors.py classification of a wrong password
        str(
            faults.classify(
                vim.fault.InvalidLogin(msg="Cannot complete login due to an incorrect user name"),
                subject="vCenter vc.example:443",
                action="login to",
            )
        ),
    ]
    for name in TRICKY_NAMES:
        messages += _credential_errors(name)
        messages += [
            f"vSphere credentials Secret demo/{name} not found: create it with keys server, "
            "username and password, or fix spec.vsphere.credentialsSecretRef",
            f"infra: reconcile of demo/{name} failed (attempt 3): Secret demo/{name}: not found",
            f"could not record event Warning/ISOCacheFailed about VsphereAgentPool demo/{name}: "
            "the server could not find the requested resource",
            f"InfraEnv demo/{name} has no status.isoDownloadURL yet; wait for the Assisted "
            "Installer to create the discovery image (condition ImageCreated)",
            f"listener for Secret demo/{name} failed",
        ]
    return messages


ORDINARY = _ordinary_messages()


@pytest.mark.parametrize("message", ORDINARY)
def test_an_ordinary_operator_message_is_never_redacted(message: str) -> None:
    assert redact(message) == message
    assert events.scrub(message) == message[: events.MAX_MESSAGE]


def test_the_real_messages_pass_the_log_pipeline_unchanged() -> None:
    for fmt in (LogFormat.JSON, LogFormat.TEXT):
        stream = io.StringIO()
        observability.configure_logging(level=LogLevel.DEBUG, fmt=fmt, stream=stream)
        log = logging.getLogger("agentforge.test")
        for message in ORDINARY:
            log.info("%s", message, extra={"key": "demo/db-token"})
        lines = stream.getvalue().splitlines()
        if fmt is LogFormat.JSON:
            entries = [json.loads(line) for line in lines]
            assert [e["msg"] for e in entries] == ORDINARY
            assert {e["key"] for e in entries} == {"demo/db-token"}
        else:
            assert [line.split(": ", 1)[1] for line in lines] == [
                f"{m} key=demo/db-token" for m in ORDINARY
            ]


# --- leak shapes are redacted -------------------------------------------------------------


def _aiohttp_error_text(url: str) -> str:
    """What aiohttp itself says about a failed request (it quotes the whole URL)."""
    info = aiohttp.RequestInfo(URL(url), "GET", CIMultiDictProxy(CIMultiDict()), URL(url))
    return str(aiohttp.ClientResponseError(info, (), status=404, message="Not Found"))


LEAKS: list[tuple[str, str]] = [
    (f"GET https://images.example/byapikey/{JWT}/4.14/x86_64/minimal.iso: 404", JWT),
    (
        f"the ISO source https://images.example/images/{INFRA_ENV_ID}?api_key={JWT}"
        "&arch=x86_64 answered HTTP 404",
        JWT,
    ),
    (_aiohttp_error_text(f"https://images.example/byapikey/{JWT}/4.14/x86_64/min.iso"), JWT),
    (_aiohttp_error_text("https://h/images/x?api_key=K3y-v4lue&arch=x86_64"), "K3y-v4lue"),
    (f"redirected to {URL('https://h/i.iso?image_token=tok987')!r}", "tok987"),
    ("request headers: Authorization: Bearer eyJhbGciOi.abc.def", "eyJhbGciOi.abc.def"),
    ('{"headers": {"Authorization": "Bearer tok-456"}}', "tok-456"),
    ('{"authorization": "Basic dXNlcjpwYXNz"}', "dXNlcjpwYXNz"),
    ("retrying with bearer sha256~Zm9vYmFyYmF6cXV4cXV1eGZvbw", "sha256~Zm9vYmFy"),
    ("vmware-api-session-id: 52b0d3f1c0a", "52b0d3f1c0a"),
    ('Cookie: vmware_soap_session="52a1b2c3"; Path=/', "52a1b2c3"),
    ("login password=hunter2&user=admin", "hunter2"),
    ('{"username": "admin", "password": "p@ss w0rd"}', "p@ss w0rd"),
    ("{'password': 'sw0rd fish'}", "sw0rd fish"),
    ("DB_PASSWORD=s3cret --token=t0ken clientSecret: 'cl1ent' apiKey=ap1", "s3cret"),
    ("DB_PASSWORD=s3cret --token=t0ken clientSecret: 'cl1ent' apiKey=ap1", "t0ken"),
    ("DB_PASSWORD=s3cret --token=t0ken clientSecret: 'cl1ent' apiKey=ap1", "cl1ent"),
    ("DB_PASSWORD=s3cret --token=t0ken clientSecret: 'cl1ent' apiKey=ap1", "ap1"),
    ("users:\n- name: sa\n  user:\n    token: abc123def", "abc123def"),
    ("vcenter https://admin:s3cr3t@vc.example/sdk refused", "s3cr3t"),
    ("https://s3.example/o.iso?X-Amz-Signature=5f0a9d3e&X-Amz-Date=20260101", "5f0a9d3e"),
    (f"token {JWT} expired", JWT),
    ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI\n-----END EC PRIVATE KEY-----", "MHcCAQEEI"),
    (json.dumps({"msg": "p", "cmd": 'login password="x y z"'}), "x y z"),
]


@pytest.mark.parametrize(("text", "secret"), LEAKS)
def test_a_credential_in_any_shape_is_redacted(text: str, secret: str) -> None:
    shown = redact(text)
    assert secret not in shown
    assert REDACTED in shown
    assert redact(shown) == shown
    assert secret not in events.scrub(text)


def test_the_url_of_a_leak_keeps_what_tells_the_image_apart() -> None:
    text = _aiohttp_error_text(f"https://images.example/byapikey/{JWT}/4.14/x86_64/min.iso")
    assert "https://images.example/byapikey/[REDACTED]/4.14/x86_64/min.iso" in redact(text)


def test_condition_messages_are_redacted_when_set() -> None:
    status: dict[str, Any] = {}
    message = f"caching failed: the ISO source https://h/byapikey/{JWT}/i.iso answered 404"
    conditions.set_condition(
        status,
        type="ISOReady",
        value="False",
        reason="ISOCacheFailed",
        message=message,
        now=datetime.now(tz=UTC),
    )
    (written,) = status["conditions"]
    assert written["message"] == redact(message)
    assert JWT not in written["message"]


# --- properties -----------------------------------------------------------------------------

B64URL = string.ascii_letters + string.digits + "-_"
WORDS = st.sampled_from(
    [
        "no", "ISO", "is", "cached", "yet", "token", "bucket", "secret", "password",
        "credentials", "key", "bearer token", "basic auth", "api", "session", "Secret", "found",
        "not", "the", "of", "pool", "check", "passwordless", "tokens", "apikey",
    ]
)  # fmt: skip
DNS_LABEL = st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
OBJECT_REF = st.builds(
    lambda ns, name, suffix: f"{ns}/{name}{suffix}",
    DNS_LABEL,
    DNS_LABEL,
    st.sampled_from(["", "-token", "-secret", "-credentials", "-password", "-api-key"]),
)
ORDINARY_TOKEN = st.one_of(
    WORDS,
    OBJECT_REF,
    OBJECT_REF.map(lambda ref: f"{ref}:"),
    WORDS.map(lambda word: f"'{word}'"),
    WORDS.map(lambda word: f"({word}),"),
)
SEPARATORS = st.sampled_from([" ", "=", "/", '"', "'", ": ", "(", ", ", "\n"])


@st.composite
def jwts(draw: st.DrawFn) -> str:
    part = st.text(B64URL, min_size=10, max_size=60)
    return f"eyJ{draw(part)}.{draw(part)}.{draw(part)}"


@settings(max_examples=300)
@given(words=st.lists(ORDINARY_TOKEN, min_size=1, max_size=12))
def test_a_message_of_ordinary_words_is_unchanged(words: list[str]) -> None:
    message = " ".join(words)
    assert redact(message) == message


@settings(max_examples=300)
@given(
    before=st.lists(ORDINARY_TOKEN, max_size=5),
    after=st.lists(ORDINARY_TOKEN, max_size=5),
    jwt=jwts(),
    sep=SEPARATORS,
)
def test_a_jwt_anywhere_in_a_message_is_redacted(
    before: list[str], after: list[str], jwt: str, sep: str
) -> None:
    message = f"{' '.join(before)}{sep}{jwt} {' '.join(after)}"
    assert jwt not in redact(message)


PASSWORD = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
    min_size=6,
    max_size=30,
).filter(lambda pw: not set(pw) & set("\"'\\"))  # a quote would end a quoted value
PASSWORD = PASSWORD.filter(lambda pw: pw not in REDACTED)  # found in the output as a part


@settings(max_examples=300)
@given(
    before=st.lists(ORDINARY_TOKEN, max_size=4),
    password=PASSWORD,
    form=st.sampled_from(
        [
            "password={}",
            "password: {}",
            '"password": "{}"',
            "'password': '{}'",
            "DB_PASSWORD={}",
            "--password={}",
            "clientSecret={}",
            "(password={}),",
            "password={}&user=admin",
            "https://admin:{}@vc.example/sdk",
            "https://h/i.iso?api_key={}&arch=x86_64",
        ]
    ),
)
def test_a_random_password_in_any_form_is_redacted(
    before: list[str], password: str, form: str
) -> None:
    if form.startswith("https://"):
        password = "".join(c for c in password if c in string.ascii_letters + string.digits)
        if len(password) < 6:
            password += "x1Y2z3"
    # The password must be found nowhere but where it was put: not in a word of the form
    # (`passwo` is in `password=`), another token or the redaction mark.
    assume(not any(password in part for part in [*before, form.format(""), REDACTED]))
    message = " ".join([*before, form.format(password)])
    assert password not in redact(message)


@settings(max_examples=500)
@given(text=st.text(max_size=200))
def test_redaction_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once
    assert redact_url(redact_url(text)) == redact_url(text)


FRAGMENTS = st.sampled_from(
    [
        "https://", "http://h", "a:b@", "u:@", "password", "token", "api_key", "=", ":",
        ": ", REDACTED, "[REDACTED", "]", "eyJabcdefgh.ijklm.nop", "sha256~" + "a" * 26,
        "?", "&", "#", ";", "/", "/byapikey/", '"', "'", "\\", '\\"', " ", "\n",
        "Bearer ", "Basic ", "Authorization", "Cookie: ", "x=", "abc", "ABC123", "(", ")",
        ",", ".", "-", "--", "_", "DB_", "...", "<pw>", "-----BEGIN PRIVATE KEY-----",
        "-----END PRIVATE KEY-----", "%2F", "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4MTIzNDU2",
        "@", "\\byapikey\\", "%62yapikey/", "/./", "<password>", "</password>", "pwd=",
        "https:\\\\", "Location: /", "--from-literal=password=",
    ]
)  # fmt: skip


@settings(max_examples=1000)
@given(parts=st.lists(FRAGMENTS, max_size=14))
@example(parts=["/byapikey/", "https://", "https://", "a:b@"])  # a token that looks like a URL
@example(parts=["Bearer ", ".", "password", "%62yapikey/", "https://"])  # encoded bearer
@example(parts=["Bearer ", "x=", "Cookie: ", "x=", "https://"])  # a bearer ends at a cookie
def test_redaction_is_idempotent_on_credential_like_fragments(parts: list[str]) -> None:
    text = "".join(parts)
    once = redact(text)
    assert redact(once) == once
    assert redact_url(redact_url(text)) == redact_url(text)


@settings(max_examples=300)
@given(
    scheme=st.sampled_from(["http", "https"]),
    host=DNS_LABEL,
    port=st.integers(min_value=1, max_value=65535),
    segments=st.lists(DNS_LABEL, max_size=4),
    jwt=jwts(),
)
def test_the_shown_url_keeps_scheme_host_port_and_plain_segments(
    scheme: str, host: str, port: int, segments: list[str], jwt: str
) -> None:
    path = "/".join(["", "byapikey", jwt, *segments, "minimal.iso"])
    shown = redact_url(f"{scheme}://{host}:{port}{path}?arch=x86_64&api_key={jwt}")
    expected_path = "/".join(["", "byapikey", REDACTED, *segments, "minimal.iso"])
    assert shown == f"{scheme}://{host}:{port}{expected_path}?arch=x86_64&api_key={REDACTED}"


def test_long_random_tells_tokens_from_ids_and_versions() -> None:
    assert redaction.long_random(JWT)
    assert redaction.long_random("Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4MTIzNDU2")
    assert redaction.long_random("0f343b0931126a20f133d67c2b018a3b")
    assert not redaction.long_random(INFRA_ENV_ID)
    assert not redaction.long_random("4.14.0-0.nightly-2026-01-01-000000")
    assert not redaction.long_random("abcdefghijklmnopqrstuvwxyzabcdefgh")


# --- a token at any credential position of a URL ---------------------------------------------
# Every part but the token is lower case, so the token (an upper-case letter next to a digit)
# can only be found in the output where it was put.

LOWER = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=8)
TOKEN = st.builds(
    lambda head, upper, digit, tail: f"{head}{upper}{digit}{tail}",
    st.text(string.ascii_letters + string.digits, max_size=6),
    st.sampled_from(string.ascii_uppercase),
    st.sampled_from(string.digits),
    st.text(string.ascii_letters + string.digits + "-_~", max_size=12),
)
TOKEN_SEGMENT = st.sampled_from(["byapikey", "bytoken", "%62yapikey", "by%61pikey", "BYTOKEN"])
SECRET_NAME = st.sampled_from(
    ["api_key", "token", "image_token", "password", "access_token", "X-Amz-Signature", "sig"]
)
SEPARATOR = st.sampled_from(["/", "\\", "//", "/./", "\\\\"])


@st.composite
def urls_with_a_token(draw: st.DrawFn) -> tuple[str, str, str]:
    """(URL, token, the URL's path-and-after part) with the token at one credential place."""
    token = draw(TOKEN)
    slot = draw(st.sampled_from(["user", "password", "path", "param", "query", "fragment"]))
    scheme = draw(st.sampled_from(["http", "https"]))
    slashes = draw(st.sampled_from(["//", "\\\\"]))
    host = draw(DNS_LABEL) + draw(st.sampled_from(["", ":443", ":8443"]))
    user = draw(DNS_LABEL)
    userinfo = {
        "user": f"{token}@",
        "password": f"{user}:"
        + draw(st.sampled_from(["{}", "p/{}", "{}#x", "p?{}", "a\\{}", "{}/b"])).format(token)
        + "@",
    }.get(slot, draw(st.sampled_from(["", f"{user}@", f"{user}:pw@"])))
    segments = draw(st.lists(LOWER, max_size=3))
    if slot == "path":
        at = draw(st.integers(min_value=0, max_value=len(segments)))
        name = draw(TOKEN_SEGMENT) + draw(st.sampled_from(["", ";v=1"]))
        segments[at:at] = [name, token + draw(st.sampled_from(["", ";v=1"]))]
    if slot == "param":
        segments.append(f"a;{draw(st.sampled_from(['jsessionid', 'token']))}={token}")
    path = "".join(draw(SEPARATOR) + s for s in [*segments, "i.iso"])
    params = [f"{draw(LOWER)}={draw(LOWER)}" for _ in range(draw(st.integers(0, 2)))]
    if slot == "query":
        params.insert(draw(st.integers(0, len(params))), f"{draw(SECRET_NAME)}={token}")
    query = draw(st.sampled_from(["&", ";"])).join(params)
    fragment = f"#access_token={token}&state=x" if slot == "fragment" else ""
    after = path + (f"?{query}" if query else "") + fragment
    return f"{scheme}:{slashes}{userinfo}{host}{after}", token, after


@settings(max_examples=500)
@given(case=urls_with_a_token(), frame=st.sampled_from(["{}", "GET {} failed", "'{}'", "({})"]))
def test_a_token_at_any_credential_place_of_a_url_never_survives(
    case: tuple[str, str, str], frame: str
) -> None:
    url, token, after = case
    assert token not in redact_url(url)
    assert token not in redact(frame.format(url))
    if "@" not in after:  # a relative reference (Location:) carries all but the user info
        assert token not in redact(f"Location: {after}")
