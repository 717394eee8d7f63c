package main

import (
	"testing"
	"time"
)

// busyCPU must parse this kernel's /proc/stat and count our own work: a
// bounded busy loop of 200 ms shows up (the counter ticks every 10 ms).
func TestBusyCPUCountsWork(t *testing.T) {
	before, err := busyCPU()
	if err != nil {
		t.Fatalf("busyCPU: %v", err)
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	for n := 0; time.Now().Before(deadline); n++ {
		_ = n * n
	}
	after, err := busyCPU()
	if err != nil {
		t.Fatalf("busyCPU: %v", err)
	}
	if before <= 0 || after <= before {
		t.Errorf("busy CPU %v before and %v after 200 ms of spinning, want it positive and growing", before, after)
	}
}
