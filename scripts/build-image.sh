#!/usr/bin/env bash
# Build the operator image from Containerfile with the first container engine that
# works here: podman, buildah, then docker. A client whose engine is not running
# (e.g. `docker` without a daemon) does not count.
#
#   scripts/build-image.sh IMAGE
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
image=${1:?usage: $0 IMAGE}
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$top/agentforge/__init__.py")
revision=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)
build_args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision")

engine_works() {
  case "$1" in
    podman) command -v podman >/dev/null 2>&1 && podman info >/dev/null 2>&1 ;;
    buildah) command -v buildah >/dev/null 2>&1 && buildah info >/dev/null 2>&1 ;;
    docker) command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 ;;
  esac
}

for engine in ${CONTAINER_ENGINE:-podman buildah docker}; do
  if engine_works "$engine"; then
    echo ">>> building $image with $engine"
    case "$engine" in
      buildah) exec buildah bud -f "$top/Containerfile" -t "$image" "${build_args[@]}" "$top" ;;
      *) exec "$engine" build -f "$top/Containerfile" -t "$image" "${build_args[@]}" "$top" ;;
    esac
  fi
done

cat >&2 <<MSG
error: no working container engine on this machine, so the image was not built.
       Tried: ${CONTAINER_ENGINE:-podman buildah docker} (a client without a running engine does not count;
       \`docker\` here is only a client unless \`docker info\` answers).
To build the image:
  - on a machine with podman, buildah or a Docker daemon:  make image IMG=$image
  - or by hand from the checkout root:  podman build -f Containerfile -t $image .
Then push it where your cluster pulls from and deploy it:  make deploy IMG=$image
MSG
exit 1
