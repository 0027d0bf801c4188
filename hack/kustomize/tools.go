//go:build tools

// Package tools pins the kustomize CLI built into .build/bin/kustomize
// (scripts/build-go-tools.sh kustomize): the version kubectl of the test control plane
// embeds, so `kustomize build` (make lint, make bundle, make chart) and `kubectl apply -k`
// (make deploy) render config/ alike.
package tools

import (
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
