// Package kubetest runs a real etcd, kube-apiserver and kube-controller-manager on loopback ports
// for tests, from the binaries scripts/kube.sh builds (the directory in $FANIN_KUBE).
package kubetest
