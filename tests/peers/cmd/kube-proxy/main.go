// Command kube-proxy is the upstream Kubernetes network proxy, built from
// the k8s.io/kubernetes Go module for the placement-policy test bed.
//
// It mirrors cmd/kube-proxy/proxy.go of k8s.io/kubernetes, including
// its blank imports, so the binary behaves like the released one.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // for client metric registration
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	command := app.NewProxyCommand()
	code := cli.Run(command)
	os.Exit(code)
}
