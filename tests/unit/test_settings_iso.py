"""The ISO download settings: `--iso-max-size`, `--iso-ca-bundle` and the proxy variables."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agentforge import settings
from agentforge.app import iso_access
from agentforge.reconcilers.infra import iso_step as infra_iso


def _load(argv: list[str], env: dict[str, str] | None = None) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.add_run_arguments(parser)
    return settings.load(parser.parse_args(argv), environ=env or {})


@pytest.mark.parametrize(
    ("text", "size"),
    [("8Gi", 8 * 2**30), ("512Mi", 512 * 2**20), ("2G", 2 * 10**9), ("1048576", 2**20)],
)
def test_the_size_cap_takes_bytes_or_a_quantity(text: str, size: int) -> None:
    assert _load(["--iso-max-size", text]).iso_max_size == size
    assert _load([], {"AGENT_FORGE_ISO_MAX_SIZE": text}).iso_max_size == size


def test_the_default_size_cap_is_8gi_and_bad_sizes_name_the_flag() -> None:
    assert _load([]).iso_max_size == 8 * 2**30
    for bad in ("8GB", "-1", "1k"):
        with pytest.raises(settings.SettingsError, match=r"invalid --iso-max-size '.*': .*64Ki"):
            _load(["--iso-max-size", bad])


def test_the_ca_bundle_may_be_missing_but_not_a_directory(tmp_path: Path) -> None:
    missing = tmp_path / "trusted-ca" / "ca-bundle.crt"
    assert _load(["--iso-ca-bundle", str(missing)]).iso_ca_bundle == missing
    with pytest.raises(settings.SettingsError, match="is a directory"):
        _load(["--iso-ca-bundle", str(tmp_path)])


def test_the_app_reads_flags_and_proxy_variables_into_the_iso_access(tmp_path: Path) -> None:
    bundle = tmp_path / "ca-bundle.crt"
    loaded = _load(["--iso-ca-bundle", str(bundle), "--iso-max-size", "1Gi"])
    access = iso_access(loaded, {"https_proxy": "proxy.corp:3128", "NO_PROXY": ".svc"})
    assert access.limits.max_bytes == 2**30
    assert access.ca_bundle is not None
    assert access.ca_bundle.path == str(bundle)
    assert access.source("https://images.example/a.iso").ca_bundle is None  # not there yet
    assert access.proxies.for_url("https://images.example/a.iso") is not None
    assert access.proxies.for_url("https://assisted-image-service.mce.svc/a.iso") is None
    with pytest.raises(ValueError, match="HTTPS_PROXY is not a proxy URL"):
        iso_access(loaded, {"HTTPS_PROXY": "socks5://proxy:1080"})


def test_the_flags_named_in_iso_ready_messages_exist() -> None:
    flags = {option.flag for option in settings.OPTIONS}
    assert {infra_iso.MAX_SIZE_FLAG, infra_iso.CA_BUNDLE_FLAG} <= flags
