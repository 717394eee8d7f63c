package main

import (
	"strings"
	"testing"

	"github.com/overlaynet/overlay/internal/version"
)

// overlayd-kube runs a command overlayd of its own build handed over, and
// refuses one from another build, saying so.
func TestHandOverFromAnotherBuildIsRefused(t *testing.T) {
	if err := checkHandOver([]string{handOverVar + "=" + version.Version}); err != nil {
		t.Errorf("same build: %v", err)
	}
	if err := checkHandOver(nil); err != nil {
		t.Errorf("not handed over: %v", err)
	}
	err := checkHandOver([]string{"A=1", handOverVar + "=v0.0.1-other"})
	if err == nil || !strings.Contains(err.Error(), "v0.0.1-other") || !strings.Contains(err.Error(), "one build") {
		t.Errorf("another build: %v; want an error naming both versions", err)
	}
}
