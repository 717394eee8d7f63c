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

func TestUptoAndWide(t *testing.T) {
	for range 1000 {
		if d := Upto(time.Second); d < 0 || d >= time.Second {
			t.Fatalf("Upto(1s) = %v, want [0, 1s)", d)
		}
		if d := Wide(time.Second); d < 500*time.Millisecond || d >= 1500*time.Millisecond {
			t.Fatalf("Wide(1s) = %v, want [0.5s, 1.5s)", d)
		}
	}
	if Upto(0) != 0 || Upto(-time.Second) != 0 {
		t.Fatal("Upto of a non-positive duration is not 0")
	}
}
