"""Credentials out of everything the operator shows: URLs, status, conditions, events, logs.

Two functions share one set of rules (docs/security.md#what-is-redacted lists them for
admins); every sink calls them: `api.conditions` (condition messages), `kube.events`
(Event messages), `observability` (every log record and formatted line), the URL
fields of status (`redact_url`), `check` (its report). Metric labels carry no free
text (names, and a vCenter's `host:port` parsed without user info).

* `redact_url(url)` is the shown form of one URL. It keeps the scheme, host, port,
  path and the query parameters that carry no secret, so an admin can still tell
  which image a pool caches, and replaces with `[REDACTED]`:
  - the whole user info (`https://[REDACTED]@host`): a user name can be a token.
    User info ends at the last `@` a host name follows, even past a `/`, `?`, `#`
    or `\\` (an unescaped password holding one);
  - the first segment after a token path segment (`/byapikey/<token>/`,
    `/bytoken/<token>/`), however the name is spelled (any case, percent-encoded
    letters, `;params`) and whatever separates them (`//`, `/./`, `\\`), and any
    JWT-shaped or `sha256~` segment;
  - query (and fragment, and `;param`) values whose name says credential
    (`SECRET_QUERY_NAMES`; names ending in `token`, `secret`, `password`, `apikey`,
    `_key`, `_signature`, `_sig`, `_credential`, camelCase read as snake_case; every
    `X-Amz-*` / `X-Goog-*` parameter of a pre-signed URL), parameters separated by
    `&` or `;`, and any value shaped like a JWT or a long random token whatever its
    name (`long_random`).
  `\\` separates like `/` (as browsers read it). Example:
  `https://images.example/byapikey/[REDACTED]/4.14/x86_64/minimal.iso`,
  `https://images.example/images/3f9a...?api_key=[REDACTED]&arch=x86_64&version=4.14`.
  Everything else is kept verbatim (no re-encoding), so the same URL always shows
  the same way and two different images show differently.
* `redact(text)` is for free text (log lines, condition and event messages,
  tracebacks). It rewrites every URL in the text with `redact_url` (a relative
  reference too: `Location: /byapikey/<token>/`, `/i.iso?api_key=<token>`) and
  replaces the values of credentials: `Authorization`/`Cookie`/session headers,
  `Bearer` and `Basic` credentials, a value after a secret *name* and `=` or `:`
  (`password=..`, `"password": ".."`, `client_secret: ..`, `DB_PASSWORD=..`,
  `apiKey=..`, `--token=..`, `pwd=..`, `--from-literal=password=..`), the content of
  an XML element so named (`<password>..</password>`), and JWTs, `sha256~` tokens
  and PEM private keys anywhere.

Where a rule cannot tell a credential from a word it redacts: the word after
`password:` or `secret:` goes whatever it is (`secret: not found` shows as
`secret: [REDACTED] found`). What keeps ordinary text unchanged is the *name* rule:
- a secret name counts only as a whole identifier of letters, digits and `_`
  (`db_password`, `clientSecret`) followed by `=` or `:`, that does not continue a
  path, a URL, an object name or another word: Kubernetes object names are
  lowercase words joined by `-` and `.`, never by `_`, so `demo/db-token:` and
  `vsphere-credentials:` are names, not keys. Hyphenated names count only as the
  known headers (`X-Auth-Token`...). A key *name* alone (`key 'password' missing`)
  is no value;
- `credentials` is not a secret name (its value is a reference or a structure);
- after `Bearer`/`Basic` only a value that is not a plain word is a credential
  (`bearer token` stays);
- placeholders (`...`, `…`, `<password>`, `***`) are not values.
`redact` is idempotent: redacting twice gives the same text.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

__all__ = [
    "REDACTED",
    "SECRET_QUERY_NAMES",
    "TOKEN_PATH_SEGMENTS",
    "long_random",
    "redact",
    "redact_url",
]

REDACTED: Final = "[REDACTED]"

TOKEN_PATH_SEGMENTS: Final = frozenset({"byapikey", "bytoken"})
"""Path segments after which the next segment is a credential (assisted-image-service:
`/byapikey/<JWT>/<version>/<arch>/<type>.iso`, `/bytoken/<token>/...`)."""

SECRET_QUERY_NAMES: Final = frozenset(
    {
        # image service and API keys
        "api_key", "apikey", "key", "image_token", "token", "jwt", "auth", "auth_token",
        # OAuth 2 / OIDC
        "access_token", "id_token", "refresh_token", "code", "client_secret", "assertion",
        # passwords and secrets
        "password", "passwd", "pwd", "pass", "secret", "private_key", "credential",
        "credentials", "authorization", "otp",
        # signatures of pre-signed URLs (Azure SAS `sig`, others `signature`)
        "sig", "signature",
        # sessions
        "session", "session_id", "sessionid", "jsessionid", "sid", "ticket",
    }
)  # fmt: skip
"""Query parameter names (lower case, `-` read as `_`) whose value is always redacted."""

_SECRET_NAME_SUFFIXES: Final = (
    *("token", "secret", "password", "passwd", "passphrase", "apikey", "sessionid"),
    *("_key", "_signature", "_sig", "_credential"),
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SECRET_NAME_PREFIXES: Final = ("x_amz_", "x_goog_")

# --- shapes ----------------------------------------------------------------------------

_B64URL = r"[A-Za-z0-9_-]"
_JWT_TEXT = rf"eyJ{_B64URL}{{5,}}\.{_B64URL}{{2,}}(?:\.{_B64URL}*){{1,3}}"
_OPENSHIFT_TOKEN = r"sha256~[A-Za-z0-9_-]{20,}"  # noqa: S105 - a pattern, not a token
_TOKEN_ANYWHERE = re.compile(rf"(?<![A-Za-z0-9_-])(?:{_JWT_TEXT}|{_OPENSHIFT_TOKEN})")
_TOKEN_EXACT = re.compile(rf"(?:{_JWT_TEXT}|{_OPENSHIFT_TOKEN})")
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
_RANDOM_CHARS = re.compile(r"[A-Za-z0-9_~+/=%-]+")
_PLAIN_WORD = re.compile(r"[A-Za-z][a-z]*(?:[A-Z][a-z]{2,})*")  # a word, or CamelCase words
_PLACEHOLDER = re.compile(r"(?:\.{2,}|…|\*+|<[^<>\s]*>|)")
LONG_RANDOM_MIN: Final = 32


def long_random(value: str) -> bool:
    """Shaped like a generated token: a JWT or `sha256~` token, or at least
    `LONG_RANDOM_MIN` characters of a base64/hex alphabet (no dots: version strings
    have them) mixing two of lower case, upper case and digits; a UUID is an id."""
    if _TOKEN_EXACT.fullmatch(value):
        return True
    if len(value) < LONG_RANDOM_MIN or not _RANDOM_CHARS.fullmatch(value):
        return False
    if _UUID.fullmatch(value):
        return False
    classes = (
        any(c.islower() for c in value)
        + any(c.isupper() for c in value)
        + any(c.isdigit() for c in value)
    )
    return classes >= 2


# --- URLs ----------------------------------------------------------------------------------

# RFC 3986 appendix B, with `\\` read as `/` (as browsers and many clients do): splits
# any string, never fails, keeps every character.
_URL_PARTS = re.compile(
    r"^(?:(?P<scheme>[^:/\\?#]+):)?(?:(?P<slashes>[/\\]{2})(?P<netloc>[^/\\?#]*))?"
    r"(?P<path>[^?#]*)(?:\?(?P<query>[^#]*))?(?:#(?P<fragment>.*))?$",
    re.DOTALL,
)
# What may follow the `@` that ends user info: a host and port, then the path.
_HOST_AFTER_AT = re.compile(r"(?:\[[0-9A-Za-z:.%]*\]|[A-Za-z0-9._~%-]+)(?::[0-9]*)?(?=[/\\?#]|$)")


def _path_name(*segments: str) -> str:
    """`(?:b|%62|%42)(?:y|%79|%59)...`: a path segment however its letters are spelled."""
    spelled = [
        "".join(f"(?:{re.escape(c)}|%{ord(c.lower()):02x}|%{ord(c.upper()):02x})" for c in name)
        for name in segments
    ]
    return "|".join(sorted(spelled))


# `/byapikey/<token>`, also `/%62yapikey/`, `/byapikey;v=1/`, `/byapikey//`, `\\byapikey\\`,
# `/byapikey/./`: the first segment after a token path segment, anywhere (relative
# references in free text too).
_TOKEN_PATH = re.compile(
    rf"(?i)(?<![A-Za-z0-9%])(?P<name>{_path_name(*TOKEN_PATH_SEGMENTS)})"
    r"(?P<params>;[^/\\\s]*)?(?P<gap>[/\\](?:[/\\]|\.(?=[/\\]))*+)"
    r"(?P<value>(?!\[REDACTED\])[^/\\\s?#\"'<>`]+)"
)


def _secret_param(name: str) -> bool:
    norm = _CAMEL.sub("_", unquote(name).strip()).lower().replace("-", "_")
    return (
        norm in SECRET_QUERY_NAMES
        or norm.endswith(_SECRET_NAME_SUFFIXES)
        or norm.startswith(_SECRET_NAME_PREFIXES)
    )


_PARAM_SEPARATOR = re.compile(r"([&;])")


def _params(text: str) -> str:
    """`a=1&api_key=x;<token>` with secret values replaced, everything else verbatim
    (`&` and `;` both separate parameters)."""
    shown = []
    for part in _PARAM_SEPARATOR.split(text):
        name, eq, value = part.partition("=")
        if part in ("&", ";"):
            shown.append(part)
        elif not eq:
            shown.append(REDACTED if long_random(unquote(name)) else part)
        elif value and value != REDACTED and (_secret_param(name) or long_random(unquote(value))):
            shown.append(f"{name}={REDACTED}")
        else:
            shown.append(part)
    return "".join(shown)


def _segment(segment: str) -> str:
    name, semi, params = segment.partition(";")
    shown = REDACTED if _TOKEN_EXACT.fullmatch(name) else name
    return f"{shown};{_params(params)}" if semi else shown


def _token_path(match: re.Match[str]) -> str:
    return f"{match['name']}{match['params'] or ''}{match['gap']}{REDACTED}"


def _path(path: str) -> str:
    path = _TOKEN_PATH.sub(_token_path, path)
    return "".join(_segment(part) for part in re.split(r"([/\\])", path))


def _split_userinfo(rest: str) -> tuple[str | None, str]:
    """`(user info, the rest)` of what follows `//`. User info ends at the last `@`
    that a host name follows, even past a `/`, `?` or `#` (an unescaped password holding
    one): read so, a password never shows as a path, at the price of a URL with a
    host-like `@name` in its path or query showing all before it redacted."""
    at = len(rest)
    while (at := rest.rfind("@", 0, at)) >= 0:
        if _HOST_AFTER_AT.match(rest, at + 1):
            return rest[:at], rest[at + 1 :]
    netloc = re.match(r"[^/\\?#]*", rest)
    assert netloc is not None  # matches the empty string at least
    userinfo, at_sign, host = netloc.group(0).rpartition("@")
    if at_sign:
        return userinfo, host + rest[netloc.end() :]
    return None, rest


def redact_url(url: str) -> str:
    """The shown form of `url`: see the module doc for what is replaced."""
    parts = _URL_PARTS.match(url)
    assert parts is not None  # the pattern matches every string
    if parts["slashes"] is not None:
        start = parts.start("netloc")
        userinfo, rest = _split_userinfo(url[start:])
        if userinfo is not None:
            return url[:start] + f"{REDACTED}@" + redact_url("//" + rest)[2:]
    shown = f"{parts['scheme']}:" if parts["scheme"] is not None else ""
    if parts["slashes"] is not None:
        shown += parts["slashes"] + parts["netloc"]
    shown += _path(parts["path"])
    if parts["query"] is not None:
        shown += "?" + _params(parts["query"])
    if parts["fragment"] is not None:
        shown += "#" + _params(parts["fragment"])
    return shown


# --- free text --------------------------------------------------------------------------

# A URL runs to white space, a quote or an angle bracket; a backslash belongs to it
# unless it escapes a quote (JSON text).
_URL_IN_TEXT = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*:[/\\]{2}(?:[^\s\"'<>`\\]|\\(?![\"']))+")
# A relative reference with a query, fragment or parameters (`Location: /i.iso?api_key=x`).
_RELATIVE_REF = re.compile(r"(?<![\w.~%:/\\-])[/\\][^\s\"'<>`]*[?#;][^\s\"'<>`]*")
_TRAILING = ".,;:!?'\""
_CLOSERS = {")": "(", "]": "[", "}": "{"}

_PEM_KEY = re.compile(
    r"(-----BEGIN (?P<kind>[A-Z0-9 ]*)PRIVATE KEY-----).*?(-----END (?P=kind)PRIVATE KEY-----)",
    re.DOTALL,
)

# `Authorization: Bearer x`, `"authorization": "Basic x"`, `X-Auth-Token: x`
_HEADER = re.compile(
    r"(?i)(?<![\w./@:=~+-])(?P<head>(?:proxy-)?authorization|vmware-api-session-id|x-auth-token"
    r"|x-api-key|x-vault-token|private-token|x-amz-security-token)"
    r"(?P<sep>\\?[\"']?\s*[:=]\s*\\?[\"']?)"
    r"(?P<scheme>(?:bearer|basic|negotiate|token)\s+)?"
    r"(?P<value>(?!\[REDACTED\])[^\s\"',;}\\]+)"
)
# `Cookie: vmware_soap_session="x"`: the first cookie's value (later ones go by name)
_COOKIE = re.compile(
    r"(?i)(?<![\w./@:=~+-])(?P<head>(?:set-)?cookie\\?[\"']?\s*[:=]\s*\\?[\"']?[^=;\s\"'\\]+=)"
    r"(?P<value>(?!\[REDACTED\])(?:\\?\"[^\"\\]*\\?\"|[^;\s\"'\\]+))"
)

_SECRET_WORDS = (
    "password|passwd|passphrase|pwd|secret|token",
    "api_?key|private_?key|soap_session|session_?id",
)
_SECRET_WORD = f"(?:{'|'.join(_SECRET_WORDS)})"
# A secret name as a whole identifier that continues no path, URL, object name or word.
_KEY_VALUE = re.compile(
    rf"(?i)(?<![\w./@:~+-])(?P<name>-{{0,2}}[A-Za-z0-9_]*?{_SECRET_WORD})(?![\w.-])"
    r"(?P<sep>[\"']?\s*[:=]\s*)"
    r"(?P<value>(?!\[REDACTED\])(?:"
    r"\\\"(?:(?!\\\").)*\\\""  # a JSON-escaped quoted value: \"...\"
    r"|\"(?:[^\"\\]|\\.)*\""
    r"|'(?:[^'\\]|\\.)*'"
    r"|\S+))"  # unquoted: up to white space (closing punctuation is given back)
)
# `<password>x</password>`, `<ns:clientSecret>x</ns:clientSecret>`
_XML_ELEMENT = re.compile(
    rf"(?i)<(?P<tag>(?:[\w.-]+:)?[A-Za-z0-9_]*?{_SECRET_WORD})(?P<attrs>\s[^<>]*)?>"
    r"(?P<value>[^<]*)</(?P=tag)\s*>"
)
_CLOSING = ",;.)]}\"'\\"
# `%` too: a percent-encoded credential is one value (and what follows it cannot turn
# into a token path on a second pass: `Bearer x%62yapikey/y`). A value ends where no
# letter or digit follows: cut inside a word, the rest could begin a header or a cookie
# that stands alone once the value is gone (`Bearer x=Cookie: y=z`).
_BEARER = re.compile(
    r"(?i)\b(?P<scheme>bearer|basic)\s+(?P<value>[A-Za-z0-9._~+/%-]+=*)(?![A-Za-z0-9])"
)


def _url_in_text(match: re.Match[str]) -> str:
    url = match.group(0)
    tail = ""
    while url and not url.endswith(REDACTED):
        last = url[-1]
        opener = _CLOSERS.get(last)
        if last in _TRAILING or (opener is not None and url.count(opener) < url.count(last)):
            tail = last + tail
            url = url[:-1]
        else:
            break
    return redact_url(url) + tail


def _header(match: re.Match[str]) -> str:
    if not match["scheme"] and _PLAIN_WORD.fullmatch(match["value"]):
        return match.group(0)  # `authorization: forbidden` is prose, not a header
    return f"{match['head']}{match['sep']}{match['scheme'] or ''}{REDACTED}"


def _cookie(match: re.Match[str]) -> str:
    value = match["value"]
    quoted = _quoted(value)
    return (
        f"{match['head']}{quoted[0]}{REDACTED}{quoted[2]}" if quoted else match["head"] + REDACTED
    )


def _quoted(value: str) -> tuple[str, str, str] | None:
    for quote in ('\\"', '"', "'"):
        if len(value) >= 2 * len(quote) and value.startswith(quote) and value.endswith(quote):
            return quote, value[len(quote) : -len(quote)], quote
    return None


def _key_value(match: re.Match[str]) -> str:
    value = match["value"]
    quoted = _quoted(value)
    tail = ""
    if quoted is None:
        kept = value.rstrip(_CLOSING)
        value, tail = kept, value[len(kept) :]
    inner = quoted[1] if quoted else value
    if _PLACEHOLDER.fullmatch(inner):
        return match.group(0)
    shown = f"{quoted[0]}{REDACTED}{quoted[2]}" if quoted else REDACTED
    return f"{match['name']}{match['sep']}{shown}{tail}"


def _xml_element(match: re.Match[str]) -> str:
    value = match["value"]
    if _PLACEHOLDER.fullmatch(value.strip()) or value == REDACTED:
        return match.group(0)
    tag = match["tag"]
    return f"<{tag}{match['attrs'] or ''}>{REDACTED}</{tag}>"


def _bearer(match: re.Match[str]) -> str:
    value = match["value"]
    if _PLAIN_WORD.fullmatch(value):
        return match.group(0)  # `bearer token` is prose
    return f"{match['scheme']} {REDACTED}"


# Cheap tests on the lower-cased text that tell when a rule cannot match: most text
# (every log line, every condition a reconcile sets) contains nothing to redact.
_HEADER_HINTS = ("authorization", "session-id", "x-auth-token", "x-api-key", "-token")
_KEY_HINT = re.compile(rf"{_SECRET_WORD}[\"']?\s*[:=]")


def redact(text: str) -> str:
    """`text` with every credential replaced by `[REDACTED]` (rules: the module doc)."""
    low = text.lower()
    if "private key-----" in low:
        text = _PEM_KEY.sub(rf"\1{REDACTED}\3", text)
    if "eyJ" in text or "sha256~" in text:
        text = _TOKEN_ANYWHERE.sub(REDACTED, text)
    # Token paths before URLs: a token may look like a URL and hide the one after it.
    if "byapikey" in low or "bytoken" in low or "%" in text:  # else there is none
        text = _TOKEN_PATH.sub(_token_path, text)
    if ":/" in text or ":\\" in text:
        text = _URL_IN_TEXT.sub(_url_in_text, text)
    if ("/" in text or "\\" in text) and ("?" in text or "#" in text or ";" in text):
        text = _RELATIVE_REF.sub(_url_in_text, text)
    if any(hint in low for hint in _HEADER_HINTS):
        text = _HEADER.sub(_header, text)
    if "cookie" in low:
        text = _COOKIE.sub(_cookie, text)
    if _KEY_HINT.search(low):
        text = _KEY_VALUE.sub(_key_value, text)
    if "</" in text:
        text = _XML_ELEMENT.sub(_xml_element, text)
    if "bearer" in low or "basic" in low:
        text = _BEARER.sub(_bearer, text)
    return text
