"""When VsphereReady's preflight runs: on changed inputs, and after failures with backoff."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agentforge import vsphere
from agentforge.reconcilers.infra.reconcile import Inputs, PreflightGate, fingerprint

NOW = datetime(2026, 5, 1, tzinfo=UTC)
A = Inputs(generation=1, credentials="fp-a")


def test_the_first_reconcile_of_a_pool_runs_the_preflight() -> None:
    assert PreflightGate().decide("ns/p", A, now=NOW).run


def test_a_success_stands_while_generation_and_credentials_are_unchanged() -> None:
    gate = PreflightGate()
    gate.record("ns/p", A, ok=True, now=NOW)
    decision = gate.decide("ns/p", A, now=NOW + timedelta(days=30))
    assert not decision.run
    assert decision.wake_at is None


def test_a_new_generation_or_new_credentials_run_it_again() -> None:
    gate = PreflightGate()
    gate.record("ns/p", A, ok=True, now=NOW)
    assert gate.decide("ns/p", Inputs(generation=2, credentials="fp-a"), now=NOW).run
    assert gate.decide("ns/p", Inputs(generation=1, credentials="fp-b"), now=NOW).run


def test_failures_are_retried_after_a_doubling_backoff_up_to_the_cap() -> None:
    gate = PreflightGate(initial_backoff=timedelta(seconds=30), max_backoff=timedelta(minutes=2))
    waits = []
    now = NOW
    for _ in range(5):
        retry_at = gate.record("ns/p", A, ok=False, now=now)
        assert retry_at is not None
        waits.append(retry_at - now)
        skipped = gate.decide("ns/p", A, now=retry_at - timedelta(seconds=1))
        assert not skipped.run
        assert skipped.wake_at == retry_at
        assert gate.decide("ns/p", A, now=retry_at).run
        now = retry_at
    assert [w.total_seconds() for w in waits] == [30, 60, 120, 120, 120]


def test_a_fixed_input_after_a_failure_runs_at_once() -> None:
    gate = PreflightGate()
    gate.record("ns/p", A, ok=False, now=NOW)
    assert gate.decide("ns/p", Inputs(generation=1, credentials="fp-fixed"), now=NOW).run


def test_forgetting_a_pool_runs_its_next_preflight() -> None:
    gate = PreflightGate()
    gate.record("ns/p", A, ok=True, now=NOW)
    gate.forget("ns/p")
    assert gate.decide("ns/p", A, now=NOW).run


def test_the_credentials_fingerprint_changes_with_the_password_and_hides_it() -> None:
    one = vsphere.Credentials(server="vc", username="u", password="pw-1")
    two = vsphere.Credentials(server="vc", username="u", password="pw-2")
    assert fingerprint(one) != fingerprint(two)
    assert fingerprint(one) == fingerprint(
        vsphere.Credentials(server="vc", username="u", password="pw-1")
    )
    assert "pw-1" not in fingerprint(one)


def test_retry_due_says_when_a_failed_preflight_may_run_again() -> None:
    gate = PreflightGate(initial_backoff=timedelta(seconds=30))
    assert not gate.retry_due("ns/p", now=NOW)  # never ran
    gate.record("ns/p", A, ok=True, now=NOW)
    assert not gate.retry_due("ns/p", now=NOW + timedelta(days=1))  # a success stands
    gate.record("ns/p", A, ok=False, now=NOW)
    assert not gate.retry_due("ns/p", now=NOW + timedelta(seconds=29))
    assert gate.retry_due("ns/p", now=NOW + timedelta(seconds=30))
