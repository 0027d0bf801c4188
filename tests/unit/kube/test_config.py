"""Configuration rules: source order, kubeconfig fields, rotating token files."""

from __future__ import annotations

import base64
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from agentforge.kube import config

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443/
    certificate-authority: {ca}
contexts:
- name: ctx
  context: {{cluster: c, user: u}}
- name: other
  context: {{cluster: c, user: filetoken}}
current-context: ctx
users:
- name: u
  user: {{token: sekret}}
- name: filetoken
  user: {{tokenFile: token.txt}}
"""


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    ca = tmp_path / "ca.crt"
    ca.write_text("not really a cert\n")
    (tmp_path / "token.txt").write_text("from-file\n")
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(ca=ca))
    return path


async def test_an_explicit_kubeconfig_gives_server_ca_and_token(kubeconfig: Path) -> None:
    cfg = await config.load_config(kubeconfig=kubeconfig, environ={})
    assert cfg.server == "https://127.0.0.1:6443"
    assert cfg.ca_file == str(kubeconfig.parent / "ca.crt")
    assert cfg.verify_tls
    assert cfg.token is not None
    assert await cfg.token.authorization() == "Bearer sekret"
    assert "sekret" not in repr(cfg), "credentials never appear in repr"


async def test_kubeconfig_env_is_used_when_no_path_is_given(kubeconfig: Path) -> None:
    cfg = await config.load_config(environ={"KUBECONFIG": str(kubeconfig)})
    assert cfg.source.startswith(f"kubeconfig {kubeconfig}")


async def test_a_token_file_is_reread_after_the_refresh_period(kubeconfig: Path) -> None:
    cfg = await config.load_config(kubeconfig=kubeconfig, context="other", environ={})
    token = cfg.token
    assert isinstance(token, config.FileToken)
    now = [0.0]
    token.clock = lambda: now[0]
    assert await token.authorization() == "Bearer from-file"
    (kubeconfig.parent / "token.txt").write_text("rotated")
    assert await token.authorization() == "Bearer from-file", "cached within the period"
    now[0] = 61.0
    assert await token.authorization() == "Bearer rotated"


async def test_invalidate_forces_a_reread(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text("one")
    token = config.FileToken(path)
    assert await token.authorization() == "Bearer one"
    path.write_text("two")
    token.invalidate()
    assert await token.authorization() == "Bearer two"


async def test_a_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="does not exist"):
        await config.load_config(kubeconfig=tmp_path / "nope", environ={})


async def test_without_any_source_or_home_directory_the_error_names_the_sources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An arbitrary UID with no passwd entry and HOME unset: there is no `~`.
    monkeypatch.delenv("HOME", raising=False)

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(config.ConfigError, match=r"pass --kubeconfig.*no home directory"):
        await config.load_config(environ={})


EMBEDDED = """
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "https://127.0.0.1:6443", certificate-authority-data: {ca}}}
contexts:
- name: ctx
  context: {{cluster: c, user: u}}
current-context: ctx
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: {python}
      args: ["-c", "{script}"]
      interactiveMode: Never
"""

PLUGIN = (
    "import json; print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', "
    "'kind': 'ExecCredential', 'status': {'token': 'from-plugin', "
    "'expirationTimestamp': '2999-01-01T00:00:00Z'}}))"
)


async def test_embedded_ca_data_and_exec_plugin_tokens_are_carried_over(tmp_path: Path) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    path = tmp_path / "kubeconfig"
    path.write_text(
        EMBEDDED.format(
            ca=base64.b64encode(pem.encode()).decode(), python=sys.executable, script=PLUGIN
        )
    )
    cfg = await config.load_config(kubeconfig=path, environ={})
    assert cfg.ca_pem == pem, "embedded data outlives the probe's temp files"
    assert cfg.ca_file is None
    assert isinstance(cfg.token, config.ExecPluginToken)
    assert await cfg.token.authorization() == "Bearer from-plugin"
    assert "from-plugin" not in repr(cfg)


def test_importing_the_operator_loads_neither_kubernetes_asyncio_nor_pyvmomi() -> None:
    """kubernetes_asyncio's generated client costs ~40 MB RSS (only the config probe
    child loads it); pyVmomi's type tables ~16 MB, loaded on the first vCenter call
    (`agentforge.vsphere.vmomi.Lazy`), so an idle operator never pays for them."""
    code = (
        "import sys, agentforge.app; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes_asyncio', 'pyVmomi'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
