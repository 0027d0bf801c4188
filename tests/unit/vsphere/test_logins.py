"""The login guard: backoff per credential, a failed-login budget per account, a breaker
per vCenter. Pure bookkeeping on an injected clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentforge.vsphere.model import errors
from agentforge.vsphere.session.credentials import Credentials, SessionKey
from agentforge.vsphere.session.logins import LoginGuard, LoginPolicy

START = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


@dataclass
class Clock:
    t: float = 1000.0
    wall_start: datetime = field(default=START)
    start: float = 1000.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return self.wall_start + timedelta(seconds=self.t - self.start)

    def advance(self, seconds: float) -> None:
        self.t += seconds


def creds(password: str, *, user: str = "svc", server: str = "vc.example") -> Credentials:
    return Credentials(server=server, username=user, password=password)


def refused() -> errors.PermissionDenied:
    return errors.PermissionDenied(
        "log in to vCenter svc@vc.example:443 failed with InvalidLogin",
        subject="vCenter",
        fault="InvalidLogin",
    )


def timed_out() -> errors.NetworkError:
    return errors.NetworkError("log in to vCenter timed out", subject="vCenter", fault="Timeout")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def guard(clock: Clock) -> LoginGuard:
    return LoginGuard(LoginPolicy(), clock=clock.mono, wall=clock.wall)


def attempt(
    guard: LoginGuard,
    c: Credentials,
    outcome: errors.VsphereError | None,
    *,
    instance: str | None = None,
) -> None:
    guard.check(c.key)
    guard.started(c.key)
    assert guard.admit(c.key, instance) == set()
    if outcome is None:
        guard.succeeded(c.key)
    else:
        guard.failed(c.key, outcome)


def test_a_refused_login_is_not_tried_again_before_its_backoff_doubling_to_the_cap(
    guard: LoginGuard, clock: Clock
) -> None:
    wrong = creds("wrong")
    waits = []
    for _ in range(5):
        attempt(guard, wrong, refused())
        start = clock.t
        with pytest.raises(errors.LoginFailed) as info:
            guard.check(wrong.key)
        assert info.value.retry_at is not None
        waits.append((info.value.retry_at - clock.wall()).total_seconds())
        while clock.t + 60 < start + waits[-1]:  # every caller meanwhile: the same answer
            clock.advance(60)
            with pytest.raises(errors.LoginFailed) as again:
                guard.check(wrong.key)
            assert str(again.value) == str(info.value)
        clock.advance(start + waits[-1] - clock.t)
        guard.check(wrong.key)  # due again
        assert clock.t - start >= waits[-1]
        clock.advance(200)  # let the account's window forget (the budget is tested apart)
    assert waits == [300, 600, 1200, 1800, 1800]


def test_the_refusal_names_the_next_attempt_and_that_a_changed_secret_is_tried_at_once(
    guard: LoginGuard, clock: Clock
) -> None:
    attempt(guard, creds("wrong"), refused())
    with pytest.raises(errors.LoginFailed) as info:
        guard.check(creds("wrong").key)
    message = str(info.value)
    assert "InvalidLogin" in message
    assert "not before 2025-01-01T12:05:00Z" in message
    assert "changed credentials Secret is tried at once" in message
    assert "wrong" not in message.replace("wrong user", "")


def test_a_rotated_password_gets_a_fresh_state_and_is_tried_at_once(guard: LoginGuard) -> None:
    attempt(guard, creds("old-wrong"), refused())
    with pytest.raises(errors.LoginFailed):
        guard.check(creds("old-wrong").key)
    guard.check(creds("rotated").key)  # no refusal of its own, budget not used up


def test_at_most_the_budget_of_failed_logins_per_account_and_window_across_passwords(
    guard: LoginGuard, clock: Clock
) -> None:
    attempt(guard, creds("one"), refused())
    clock.advance(10)
    attempt(guard, creds("two"), refused())
    with pytest.raises(errors.LoginDeferred) as info:
        guard.check(creds("three").key)
    assert "2 failed login(s)" in str(info.value)
    assert info.value.retry_at == START + timedelta(seconds=180)
    with pytest.raises(errors.LoginDeferred):
        guard.check(creds("right").key)  # the right one waits too: no lockout for anyone
    guard.check(creds("one", user="other").key)  # another account is not concerned
    guard.check(creds("one", server="vc2.example").key)  # nor another vCenter
    clock.advance(170.5)  # the first failure leaves the window
    guard.check(creds("three").key)


def test_logins_in_flight_count_against_the_budget(guard: LoginGuard) -> None:
    first, second, third = creds("a"), creds("b"), creds("c")
    guard.check(first.key)
    guard.started(first.key)
    assert not guard.budget_busy(second.key)
    guard.started(second.key)
    assert guard.budget_busy(third.key)
    guard.succeeded(first.key)
    assert not guard.budget_busy(third.key)


def test_a_connection_failure_opens_the_breaker_and_uses_no_login_budget(
    guard: LoginGuard, clock: Clock
) -> None:
    down = creds("right")
    attempt(guard, down, timed_out())
    with pytest.raises(errors.VcenterUnreachable) as info:
        guard.check(creds("other-password").key)
    assert info.value.retry_at == START + timedelta(seconds=10)
    with pytest.raises(errors.VcenterUnreachable):
        guard.check_reachable("vc.example:443")
    guard.check(creds("x", server="vc2.example").key)  # other vCenters are not concerned
    clock.advance(10)
    guard.check(down.key)
    attempt(guard, down, timed_out())
    with pytest.raises(errors.VcenterUnreachable) as again:
        guard.check(down.key)
    assert again.value.retry_at == clock.wall() + timedelta(seconds=20)  # doubled
    for _ in range(5):  # unanswered logins never defer the account
        clock.advance(400)
        attempt(guard, down, timed_out())
    clock.advance(400)
    attempt(guard, down, None)
    guard.check_reachable("vc.example:443")


def test_a_call_that_got_an_answer_closes_the_breaker(guard: LoginGuard) -> None:
    guard.unreachable("vc.example:443", timed_out())
    with pytest.raises(errors.VcenterUnreachable):
        guard.check_reachable("vc.example:443")
    guard.reachable("vc.example:443")
    guard.check_reachable("vc.example:443")


def test_other_login_failures_back_off_per_credential_without_using_the_budget(
    guard: LoginGuard, clock: Clock
) -> None:
    untrusted = errors.ConnectionFailed(
        "the vCenter certificate is not trusted", fault="SSLCertVerificationError"
    )
    attempt(guard, creds("a"), untrusted)
    with pytest.raises(errors.SessionUnavailable) as info:
        guard.check(creds("a").key)
    assert not isinstance(info.value, errors.LoginFailed | errors.LoginDeferred)
    assert "not trusted" in str(info.value)
    attempt(guard, creds("b"), untrusted)
    guard.check(creds("c").key)  # no failed login was counted
    clock.advance(30)
    guard.check(creds("a").key)


def test_a_success_clears_the_credentials_refusal(guard: LoginGuard, clock: Clock) -> None:
    c = creds("flaky")
    attempt(guard, c, refused())
    clock.advance(300)
    attempt(guard, c, None)
    clock.advance(200)
    attempt(guard, c, refused())
    with pytest.raises(errors.LoginFailed) as info:
        guard.check(c.key)
    assert "1 refused login(s)" in str(info.value)  # counted from the success on


def test_a_raised_refusal_carries_no_traceback_of_earlier_raises(guard: LoginGuard) -> None:
    attempt(guard, creds("wrong"), refused())
    seen = []
    for _ in range(3):
        try:
            guard.check(creds("wrong").key)
        except errors.LoginFailed as exc:
            seen.append(exc)
    assert len({id(e) for e in seen}) == 3


# --- one budget per real account ----------------------------------------------------------

UUID = "5f2b8c2e-0c1d-4c55-9d2f-3a4b5c6d7e8f"


def test_every_spelling_of_one_account_shares_its_budget(guard: LoginGuard) -> None:
    attempt(guard, creds("a", user="Administrator@vsphere.local"), refused())
    attempt(guard, creds("b", user="VSPHERE.LOCAL\\administrator", server="VC.Example."), refused())
    for user, server in [
        ("administrator@VSPHERE.LOCAL", "vc.example"),
        ("administrator", "https://vc.example:443/sdk"),
        ("vsphere.local\\ADMINISTRATOR", "vc.example.:443"),
    ]:
        with pytest.raises(errors.LoginDeferred):
            guard.check(creds("c", user=user, server=server).key)
    guard.check(creds("c", user="svc@vsphere.local").key)  # another account
    guard.check(creds("c", user="administrator", server="vc.example:8443").key)  # another port


def test_a_name_and_its_address_are_one_vcenter_once_it_answered(
    guard: LoginGuard, clock: Clock
) -> None:
    by_name, by_address = creds("a", server="vc.example"), creds("b", server="10.0.0.5")
    attempt(guard, by_name, refused(), instance=UUID)
    clock.advance(10)
    guard.check(by_address.key)  # before it answered, the address is not known as the name
    guard.started(by_address.key)
    assert guard.admit(by_address.key, UUID.upper()) == set()  # the second failure of two
    guard.failed(by_address.key, refused())
    third = creds("c", server="VC.EXAMPLE.")
    with pytest.raises(errors.LoginDeferred):
        guard.check(third.key)
    fresh = creds("d", server="[::ffff:10.0.0.5]")  # yet another spelling, not seen before
    guard.check(fresh.key)
    guard.started(fresh.key)
    with pytest.raises(errors.LoginDeferred) as info:
        guard.admit(fresh.key, UUID)  # answered: it is that vCenter, no credentials sent
    assert info.value.retry_at == START + timedelta(seconds=180)
    guard.abandoned(fresh.key)


def test_a_login_that_would_overshoot_the_joined_budget_waits_for_the_admitted_ones(
    guard: LoginGuard,
) -> None:
    one, two = creds("a", server="vc.example"), creds("b", server="10.0.0.5")
    attempt(guard, creds("x", server="vc-alias.example"), refused(), instance=UUID)
    for c in (one, two):
        guard.check(c.key)
        assert not guard.budget_busy(c.key)  # three spellings: not known as one yet
        guard.started(c.key)
    assert guard.admit(one.key, UUID) == set()
    assert guard.admit(two.key, UUID) == {one.key}  # 1 failure + 1 admitted: the budget
    guard.succeeded(one.key)
    assert guard.admit(two.key, UUID) == set()


def _cases(text: str) -> list[str]:
    return [text, text.upper(), text.capitalize(), text.swapcase().capitalize().swapcase()]


USERS = [
    spelled
    for name in _cases("administrator")
    for domain in _cases("vsphere.local")
    for spelled in (f"{name}@{domain}", f"{domain}\\{name}", name)
]
"""`administrator` of `vsphere.local`, as anyone may write it."""
SERVERS = [
    spelled
    for host in [
        *_cases("vc.example"),
        "vc.example.",
        "vcenter-alias.example",
        "10.0.0.5",
        "[fd00::5]",
        "[FD00:0:0::5]",
    ]
    for port in ("", ":443")
    for spelled in (f"{host}{port}", f"https://{host}{port}/sdk")
]
"""One vCenter by its names and addresses, in every form the Secret's `server` takes."""


STEP = st.tuples(
    st.sampled_from(["start", "connect", "refused", "wait"]),
    st.integers(min_value=0, max_value=len(SERVERS) * len(USERS) * 3),
)
WAITS = [0.5, 10.0, 60.0, 179.5, 180.0, 400.0]


@settings(max_examples=300)
@given(steps=st.lists(STEP, min_size=1, max_size=40))
def test_any_spellings_of_one_account_get_at_most_the_budget_of_failed_logins_per_window(
    steps: list[tuple[str, int]],
) -> None:
    """Logins start, connect (the vCenter answers with its instance UUID), send their
    wrong password, and time passes, in any order: the failed logins vCenter sees in
    any window are never more than the budget. A step's number picks the spelling,
    the password, the login or the wait."""
    clock = Clock()
    policy = LoginPolicy()
    guard = LoginGuard(policy, clock=clock.mono, wall=clock.wall)
    connecting: list[SessionKey] = []
    sending: list[SessionKey] = []
    sent: list[float] = []  # when vCenter saw a wrong password
    for step, n in steps:
        if step == "start":
            server, user = SERVERS[n % len(SERVERS)], USERS[n // len(SERVERS) % len(USERS)]
            key = Credentials(server, user, "abc"[n // (len(SERVERS) * len(USERS)) % 3]).key
            if key in connecting or key in sending:
                continue  # one login per credential at a time (the registry's rule)
            try:
                guard.check(key)
            except errors.SessionUnavailable:
                continue
            if not guard.budget_busy(key):
                guard.started(key)
                connecting.append(key)
        elif step == "connect" and connecting:
            key = connecting[n % len(connecting)]
            try:
                wait_for = guard.admit(key, UUID)
            except errors.LoginDeferred:
                connecting.remove(key)
                guard.abandoned(key)
                continue
            if not wait_for:
                connecting.remove(key)
                sending.append(key)
                sent.append(clock.t)
        elif step == "refused" and sending:
            key = sending[n % len(sending)]
            sending.remove(key)
            guard.failed(key, refused())
        elif step == "wait":
            clock.advance(WAITS[n % len(WAITS)])
    for t in sent:
        in_window = [u for u in sent if t - policy.window_seconds < u <= t]
        assert len(in_window) <= policy.max_failed_logins
