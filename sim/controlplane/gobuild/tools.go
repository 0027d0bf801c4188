//go:build tools

// Package tools pins the binaries this module builds: kube-apiserver, etcd and kubectl.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
