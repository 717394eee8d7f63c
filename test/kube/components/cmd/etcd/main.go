// Command etcd is the Kubernetes API server's own etcd in the lab (apart
// from the overlay's), at the version the pinned release is tested with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
