// Command kube-scheduler is the upstream Kubernetes scheduler, built from
// the k8s.io/kubernetes Go module for the placement-policy test bed.
//
// It mirrors cmd/kube-scheduler/scheduler.go of k8s.io/kubernetes, including
// its blank imports, so the binary behaves like the released one.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version" // for version metric registration
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	command := app.NewSchedulerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
