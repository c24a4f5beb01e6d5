// Command etcd is the upstream etcd server, built from the
// go.etcd.io/etcd/server/v3 Go module for the placement-policy test bed.
//
// It mirrors the main package of go.etcd.io/etcd/v3, which only hands its
// arguments to etcdmain.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
