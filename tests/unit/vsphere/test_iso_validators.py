"""Revalidation trusts only strong validators: a strong ETag, or Last-Modified + length."""

from __future__ import annotations

from agentforge.vsphere.iso.pipeline import Validators, final_path


def test_same_strong_etag_is_the_same_version() -> None:
    assert Validators(etag='"a"').same_as(Validators(etag='"a"'))
    assert not Validators(etag='"a"').same_as(Validators(etag='"b"'))


def test_weak_etags_fall_back_to_last_modified_and_length() -> None:
    old = Validators(etag='W/"a"', last_modified="Mon", content_length=5)
    assert old.same_as(Validators(etag='W/"a"', last_modified="Mon", content_length=5))
    assert not old.same_as(Validators(etag='W/"a"', last_modified="Mon", content_length=6))


def test_no_validators_never_match() -> None:
    assert not Validators().same_as(Validators())
    assert not Validators().usable


def test_header_parsing() -> None:
    got = Validators.of({"ETag": '"x"', "Content-Length": "12", "Last-Modified": "Tue"})
    assert got == Validators(etag='"x"', last_modified="Tue", content_length=12)


def test_content_addressed_name() -> None:
    assert final_path("/agent-forge/ns/p/", "ab" * 32) == f"agent-forge/ns/p/{'ab' * 32}.iso"


def test_different_etags_are_different_versions_whatever_the_dates_say() -> None:
    # Last-Modified has one-second resolution and same-size images are common: two
    # different ETags, weak ones included, must never pass for the same version.
    old = Validators(etag='W/"a"', last_modified="Mon", content_length=5)
    assert not old.same_as(Validators(etag='W/"b"', last_modified="Mon", content_length=5))
    assert not old.same_as(Validators(etag='"a"', last_modified="Mon", content_length=5))
    assert not Validators(etag='"a"', last_modified="Mon", content_length=5).same_as(
        Validators(etag='"b"', last_modified="Mon", content_length=5)
    )


def test_last_modified_alone_needs_a_known_equal_length() -> None:
    assert Validators(last_modified="Mon", content_length=5).same_as(
        Validators(last_modified="Mon", content_length=5)
    )
    assert not Validators(last_modified="Mon").same_as(Validators(last_modified="Mon"))


def test_a_304_naming_another_etag_contradicts_the_stored_one() -> None:
    stored = Validators(etag='"a"', content_length=5)
    assert stored.contradicts(Validators(etag='"b"'))
    assert not stored.contradicts(Validators(etag='W/"a"'))  # weak comparison, RFC 9110
    assert not stored.contradicts(Validators())  # a 304 need not repeat it
    assert not Validators().contradicts(Validators(etag='"b"'))
