package kubee2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/ociimage"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// The lab's images, built here and imported into every node's containerd:
// nothing is pulled. Tags are not "latest", so kubelet never tries a pull.
const (
	pauseImage   = "localhost/overlay-lab/pause:lab"
	echoImage    = "localhost/overlay-lab/echo:lab"
	overlayImage = "localhost/overlay-lab/overlay:lab1"
	// overlayImage2 is the same image under a new tag: the rolling update's.
	overlayImage2 = "localhost/overlay-lab/overlay:lab2"
)

// buildImages builds the echo program (test/kube/echo, static) and writes
// one OCI archive with the pause and echo images (the same one-file
// layer) and overlay's image: overlayd, overlayd-kube and overlay-cni in
// /usr/local/bin, nothing else, as deploy/Dockerfile's final stage.
func (c *cluster) buildImages(t testing.TB) string {
	t.Helper()
	echo := filepath.Join(c.dir, "kube-echo")
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(5*time.Minute))
	defer cancel()
	if out, err := c.runHere(ctx, testenv.ProgramEnv("CGO_ENABLED=0"), "go", "build", "-trimpath", "-o", echo, "./test/kube/echo"); err != nil {
		t.Fatalf("build test/kube/echo: %v\n%s", err, out)
	}
	read := func(p string) []byte {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	echoLayer, err := ociimage.Layer([]ociimage.File{{Name: "kube-echo", Mode: 0o755, Data: read(echo)}})
	if err != nil {
		t.Fatal(err)
	}
	overlayLayer, err := ociimage.Layer([]ociimage.File{
		{Name: "usr", Mode: 0o755, Dir: true},
		{Name: "usr/local", Mode: 0o755, Dir: true},
		{Name: "usr/local/bin", Mode: 0o755, Dir: true},
		{Name: "usr/local/bin/overlayd", Mode: 0o755, Data: read(testenv.Binary(t, "overlayd"))},
		{Name: "usr/local/bin/overlayd-kube", Mode: 0o755, Data: read(testenv.Binary(t, "overlayd-kube"))},
		{Name: "usr/local/bin/overlay-cni", Mode: 0o755, Data: read(testenv.Binary(t, "overlay-cni"))},
	})
	if err != nil {
		t.Fatal(err)
	}
	archive, err := ociimage.Archive(
		ociimage.Image{Name: pauseImage, Layer: echoLayer, Entrypoint: []string{"/kube-echo", "pause"}},
		ociimage.Image{Name: echoImage, Layer: echoLayer, Entrypoint: []string{"/kube-echo"}, Cmd: []string{"serve"}},
		ociimage.Image{Name: overlayImage, Layer: overlayLayer, Entrypoint: []string{"/usr/local/bin/overlayd"}},
		ociimage.Image{Name: overlayImage2, Layer: overlayLayer, Entrypoint: []string{"/usr/local/bin/overlayd"}},
	)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.dir, "images.tar")
	if err := os.WriteFile(path, archive, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
