"""The login guard: backoff per credential, a failed-login budget per account, a breaker
per vCenter. Pure bookkeeping on an injected clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from agentforge.vsphere.credentials import Credentials
from agentforge.vsphere.logins import LoginGuard, LoginPolicy
from agentforge.vsphere.model import errors

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


def attempt(guard: LoginGuard, c: Credentials, outcome: errors.VsphereError | None) -> None:
    guard.check(c.key)
    guard.started(c.key)
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
