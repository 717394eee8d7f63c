package kubee2e

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

func TestMain(m *testing.M) {
	if os.Getenv(supervisorEnv) != "" {
		runSupervisor() // never returns
	}
	// An interrupted run (Ctrl-C, a CI timeout's SIGTERM) still stops
	// everything the lab started and removes what it made.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sig
		// go test may be gone too: a write to its pipe must fail, not
		// kill this process before the lab is removed (SIGPIPE).
		signal.Ignore(syscall.SIGPIPE)
		fmt.Fprintf(os.Stderr, "kube lab: %v: removing the lab\n", s)
		liveMu.Lock()
		var live []*cluster
		for c := range liveClusters {
			live = append(live, c)
		}
		liveMu.Unlock()
		for _, c := range live {
			if err := c.close(); err != nil {
				fmt.Fprintf(os.Stderr, "kube lab cleanup: %v\n", err)
			}
		}
		os.Exit(1)
	}()
	os.Exit(m.Run())
}
