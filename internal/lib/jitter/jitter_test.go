package jitter

import (
	"testing"
	"time"
)

func TestSpread(t *testing.T) {
	for range 1000 {
		if d := Spread(10 * time.Second); d < 9*time.Second || d > 11*time.Second {
			t.Fatalf("Spread(10s) = %v, want within ±10%%", d)
		}
	}
	if d := Spread(1); d != 1 {
		t.Fatalf("Spread(1ns) = %v", d)
	}
}
