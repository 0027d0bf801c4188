#!/usr/bin/env bash
# Build the Go test infrastructure (never the operator) into .build/bin, once.
#
#   scripts/build-go-tools.sh controlplane   -> kube-apiserver, kubectl, etcd
#   scripts/build-go-tools.sh vcsim          -> vcsim-af (our simulator launcher), govc
#   scripts/build-go-tools.sh helm           -> helm (charts/agent-forge: lint, template, e2e)
#   scripts/build-go-tools.sh olm-validate   -> olm-validate (operator-framework's bundle checks)
#   scripts/build-go-tools.sh kustomize      -> kustomize (renders config/ for lint, bundle, chart)
#
# Versions are pinned in exactly one place per tool: the go.mod of
# sim/controlplane/gobuild, sim/vcsim/gobuild and hack/<tool>. A stamp
# file holds the sha256 of that go.mod (and the sources); when it matches, nothing is
# rebuilt.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bin="$top/.build/bin"
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

if ! command -v go >/dev/null 2>&1; then
  echo "error: the Go toolchain is needed to build the test control plane and vSphere simulator." >&2
  echo "       Install Go 1.26 or newer (https://go.dev/doc/install) and run make again." >&2
  exit 1
fi

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

build_controlplane() {
  local mod="$top/sim/controlplane/gobuild"
  local want; want=$(stamp_of "$mod/go.mod" "$mod/go.sum")
  if [[ -x "$bin/kube-apiserver" && -x "$bin/etcd" && -x "$bin/kubectl" && "$(cat "$bin/.controlplane.stamp" 2>/dev/null)" == "$want" ]]; then
    return 0
  fi
  local kv; kv=$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$mod/go.mod")
  local minor; minor=$(echo "$kv" | cut -d. -f2)
  echo ">>> Building kube-apiserver $kv, kubectl and etcd from Go modules into .build/bin."
  echo ">>> The first build takes several minutes (10-20 on 2 cores); later builds reuse Go's caches."
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$kv -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  done
  local start=$SECONDS
  (cd "$mod" && go build -trimpath -ldflags "$ld" -o "$bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
  (cd "$mod" && go build -trimpath -ldflags "$ld" -o "$bin/kubectl" k8s.io/kubernetes/cmd/kubectl)
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
  echo "$want" > "$bin/.controlplane.stamp"
  echo ">>> control plane binaries built in $((SECONDS - start)) s"
}

build_vcsim() {
  local mod="$top/sim/vcsim/gobuild"
  local want; want=$(stamp_of "$mod/go.mod" "$mod/go.sum" "$mod"/*.go "$mod"/govc/*.go)
  if [[ -x "$bin/vcsim-af" && -x "$bin/govc" && "$(cat "$bin/.vcsim.stamp" 2>/dev/null)" == "$want" ]]; then
    return 0
  fi
  echo ">>> Building the vSphere simulator (govmomi vcsim + fault injection) and govc into .build/bin."
  echo ">>> The first build takes a few minutes; later builds reuse Go's caches."
  local start=$SECONDS
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$bin/vcsim-af" .)
  # govc's own main package sits in a nested module the proxy does not serve; ./govc is an
  # equivalent main over the same govmomi version's cli packages.
  local gv; gv=$(awk '{for (i = 1; i < NF; i++) if ($i == "github.com/vmware/govmomi") {print $(i+1); exit}}' "$mod/go.mod")
  (cd "$mod" && go build -trimpath -ldflags "-s -w -X main.version=$gv" -o "$bin/govc" ./govc)
  echo "$want" > "$bin/.vcsim.stamp"
  echo ">>> simulator binaries built in $((SECONDS - start)) s"
}

# One binary from a small module under hack/: $1 name, $2 module dir, $3 package, $4 ldflags.
build_hack_tool() {
  local name=$1 mod="$top/$2" pkg=$3 ld=$4
  local want; want=$(stamp_of "$mod/go.mod" "$mod/go.sum" $(find "$mod" -name '*.go' | sort))
  if [[ -x "$bin/$name" && "$(cat "$bin/.$name.stamp" 2>/dev/null)" == "$want" ]]; then
    return 0
  fi
  echo ">>> Building $name from Go modules ($2/go.mod) into .build/bin; the first build takes a few minutes."
  local start=$SECONDS
  (cd "$mod" && go build -trimpath -ldflags "$ld" -o "$bin/$name" "$pkg")
  echo "$want" > "$bin/.$name.stamp"
  echo ">>> $name built in $((SECONDS - start)) s"
}

build_helm() {
  local hv; hv=$(awk '$1=="require" && $2=="helm.sh/helm/v4"{print $3; exit} $1=="helm.sh/helm/v4"{print $2; exit}' "$top/hack/helm/go.mod")
  build_hack_tool helm hack/helm helm.sh/helm/v4/cmd/helm \
    "-s -w -X helm.sh/helm/v4/internal/version.version=$hv -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
}

for what in "$@"; do
  case "$what" in
    controlplane) build_controlplane ;;
    vcsim) build_vcsim ;;
    helm) build_helm ;;
    olm-validate) build_hack_tool olm-validate hack/olm-validate . "-s -w" ;;
    kustomize)
      kz=$(awk '$1=="require" && $2=="sigs.k8s.io/kustomize/kustomize/v5"{print $3; exit}' "$top/hack/kustomize/go.mod")
      build_hack_tool kustomize hack/kustomize sigs.k8s.io/kustomize/kustomize/v5 \
        "-s -w -X sigs.k8s.io/kustomize/api/provenance.version=$kz" ;;
    *) echo "usage: $0 controlplane|vcsim|helm|olm-validate|kustomize ..." >&2; exit 2 ;;
  esac
done
