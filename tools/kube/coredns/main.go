// Command coredns is CoreDNS v1.14 with only the plugins a one-node test cluster's DNS uses
// (scripts/kube-node.sh): kubernetes answers for Services and pods, bind (to the node's address
// only), errors, health, ready, cache, and forward for names outside the cluster. CoreDNS's own main links about 50 plugins and their
// cloud SDKs; this one builds from the packages the Kubernetes binaries of this module already
// compile (client-go at the same version), so it adds little to scripts/kube.sh's build.
//
// The plugins are registered by their imports; the directives are their order in the server's
// plugin chain, as CoreDNS's plugin.cfg orders them.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "cache", "kubernetes", "forward"}
}

func main() { coremain.Run() }
