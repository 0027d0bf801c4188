#!/usr/bin/env bash
# Build the operator image from Containerfile with the first container engine that
# works here: podman, buildah, then docker. A client whose engine is not running
# (e.g. `docker` without a daemon) does not count.
#
#   scripts/build-image.sh [--platforms linux/amd64,linux/arm64] [--push] IMAGE
#
# One platform (the default): a local image IMAGE. With --platforms: one image per
# platform under the manifest list IMAGE (podman/buildah `--manifest`, docker `buildx`);
# --push pushes the list with every platform's image (docker buildx can only push a
# multi-platform build: it needs --push). Building for a platform other than the host's
# runs the builder stage under emulation (qemu-user-static registered with binfmt_misc);
# nothing is compiled, pip only unpacks wheels. PYTHON_IMAGE in the environment picks
# the base image (e.g. Red Hat UBI, see Containerfile).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
platforms=""
push=""
while [[ $# -gt 1 ]]; do
  case "$1" in
    --platforms) platforms=${2:?--platforms needs a value}; shift 2 ;;
    --push) push=1; shift ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
done
image=${1:?usage: $0 [--platforms LIST] [--push] IMAGE}
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$top/agentforge/__init__.py")
revision=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)
build_args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision")
if [[ -n "${PYTHON_IMAGE:-}" ]]; then
  build_args+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
fi
containerfile=(-f "$top/Containerfile")

engine_works() {
  case "$1" in
    podman) command -v podman >/dev/null 2>&1 && podman info >/dev/null 2>&1 ;;
    buildah) command -v buildah >/dev/null 2>&1 && buildah info >/dev/null 2>&1 ;;
    docker)
      command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 &&
        { [[ -z "$platforms" ]] || docker buildx version >/dev/null 2>&1; } ;;
  esac
}

build() {
  local engine=$1
  if [[ -z "$platforms" ]]; then
    echo ">>> building $image with $engine"
    case "$engine" in
      buildah) buildah bud "${containerfile[@]}" -t "$image" "${build_args[@]}" "$top" ;;
      *) "$engine" build "${containerfile[@]}" -t "$image" "${build_args[@]}" "$top" ;;
    esac
    if [[ -n "$push" ]]; then "$engine" push "$image"; fi
    return
  fi
  echo ">>> building $image for $platforms with $engine"
  case "$engine" in
    podman | buildah)
      # A stale list of the same name would collect the old images too.
      "$engine" manifest rm "$image" >/dev/null 2>&1 || true
      "$engine" build --platform "$platforms" --manifest "$image" "${containerfile[@]}" \
        "${build_args[@]}" "$top"
      if [[ -n "$push" ]]; then "$engine" manifest push --all "$image" "docker://$image"; fi
      ;;
    docker)
      if [[ -z "$push" ]]; then
        echo "error: docker buildx keeps a multi-platform build only by pushing it: add PUSH=1" >&2
        exit 1
      fi
      docker buildx build --platform "$platforms" --push -t "$image" "${containerfile[@]}" \
        "${build_args[@]}" "$top"
      ;;
  esac
}

for engine in ${CONTAINER_ENGINE:-podman buildah docker}; do
  if engine_works "$engine"; then
    build "$engine"
    exit 0
  fi
done

target="make image IMG=$image"
if [[ -n "$platforms" ]]; then target="make image-multiarch IMG=$image"; fi
cat >&2 <<MSG
error: no working container engine on this machine, so the image was not built.
       Tried: ${CONTAINER_ENGINE:-podman buildah docker} (a client without a running engine does not count;
       \`docker\` here is only a client unless \`docker info\` answers${platforms:+, and multi-platform builds need \`docker buildx\`}).
To build the image:
  - on a machine with podman, buildah or a Docker daemon:  $target
  - or by hand from the checkout root:  podman build -f Containerfile -t $image .
Then push it where your cluster pulls from and deploy it:  make deploy IMG=$image
MSG
exit 1
