// Command overlayd is the overlay network daemon (`overlayd run`) and its
// etcdctl-style management CLI (`overlayd lease|config|status ...`).
package main

import (
	"os"
)

func main() {
	os.Exit(execute(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
