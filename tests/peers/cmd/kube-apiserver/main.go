// Command kube-apiserver is the upstream Kubernetes API server, built from
// the k8s.io/kubernetes Go module for the placement-policy test bed.
//
// It mirrors cmd/kube-apiserver/apiserver.go of k8s.io/kubernetes, including
// its blank imports, so the binary behaves like the released one.
package main

import (
	"os"
	_ "time/tzdata" // for timeZone support in CronJob

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	command := app.NewAPIServerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
