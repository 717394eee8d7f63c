package testenv

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// ScaleEnv names the environment variable that multiplies every test
// deadline (a positive number, default 1). A deadline in a test is a bound on
// "this never happens", not a speed measurement: raise it on a machine much
// slower than a 2-core VM, never lower it to make a test "faster".
const ScaleEnv = "OVERLAY_TEST_TIMEOUT_SCALE"

var scale = sync.OnceValues(func() (float64, error) {
	v := os.Getenv(ScaleEnv)
	if v == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > 1000 {
		return 1, fmt.Errorf("%s=%q: want a positive number such as 2 or 0.5", ScaleEnv, v)
	}
	return f, nil
})

// Deadline returns d multiplied by OVERLAY_TEST_TIMEOUT_SCALE. Every wait in
// the suites goes through it, so one knob stretches them all. Derive d from
// the product periods the wait covers (a TTL, a stall detector's period, a
// retry backoff) plus Slack, never from how fast a run usually is.
func Deadline(d time.Duration) time.Duration {
	f, err := scale()
	if err != nil {
		panic(err) // a bad knob is a broken test invocation, reported at once
	}
	return time.Duration(float64(d) * f)
}

// Slack is the scheduling margin every deadline adds on top of the product
// periods it waits for: on a 2-core machine that is also compiling, running
// the race detector and other packages' tests, a goroutine or an etcd fsync
// can be late by seconds.
const Slack = 10 * time.Second

// Eventually polls cond every 20 ms until it returns nil, failing t with
// cond's last error once Deadline(timeout) has passed. It returns how long it
// took.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	timeout = Deadline(timeout)
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitFor is Eventually for a condition without a reason to report.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return Eventually(t, timeout, what, func() error {
		if cond() {
			return nil
		}
		return fmt.Errorf("condition still false")
	})
}
