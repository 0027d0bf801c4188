//go:build tools

// Package tools pins the Helm CLI built into .build/bin/helm (scripts/build-go-tools.sh helm).
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
