// Command kube-controller-manager is the upstream Kubernetes controller manager, built from
// the k8s.io/kubernetes Go module for the placement-policy test bed.
//
// It mirrors cmd/kube-controller-manager/controller-manager.go of k8s.io/kubernetes, including
// its blank imports, so the binary behaves like the released one.
package main

import (
	"os"
	_ "time/tzdata" // for CronJob Time Zone support

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugin
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	command := app.NewControllerManagerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
