// Command pause is the process of the test bed's sandbox ("pause") image: it
// holds a pod's namespaces open until the kubelet stops the sandbox. No image
// registry is reachable, so the image is built locally from this program, as
// Kubernetes' own build/pause does from C.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		// With a shared process namespace the pause process is PID 1 of the
		// pod: reap the orphans it inherits.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
