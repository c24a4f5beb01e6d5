// Command kubelet is the upstream Kubernetes node agent, built from
// the k8s.io/kubernetes Go module for the placement-policy test bed.
//
// It mirrors cmd/kubelet/kubelet.go of k8s.io/kubernetes, including
// its blank imports, so the binary behaves like the released one.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // for client metric registration
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	command := app.NewKubeletCommand(context.Background())
	code := cli.Run(command)
	os.Exit(code)
}
