// Command pause is the process of a pod's sandbox on scripts/kube-node.sh's node: it holds the
// pod's namespaces, reaps the zombies of a shared process namespace, and exits on SIGINT or
// SIGTERM. Kubernetes' own pause is a C program in an image from registry.k8s.io, which this
// machine cannot reach; this one is built here, static, and put in an image by cmd/fanin-image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	child := make(chan os.Signal, 1)
	signal.Notify(child, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-child:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
