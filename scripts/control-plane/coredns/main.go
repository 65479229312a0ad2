// CoreDNS, the cluster DNS of scripts/control-plane.sh's real node: CoreDNS's own main with the
// plugins its Corefile uses, built with the control plane (whose Kubernetes client it shares)
// rather than with every plugin of CoreDNS's default build (cloud DNS providers among them).
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
