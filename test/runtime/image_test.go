package runtimee2e

import (
	"os"
	"path/filepath"

	"github.com/overlaynet/overlay/internal/testing/ociimage"
)

// imageName is the test image in both runtimes; nothing is ever pulled.
const imageName = "localhost/overlay-test:latest"

// indexHTML is what the image's httpd serves (the -p test fetches it).
const indexHTML = "overlay-test\n"

// image is the test image: a busybox rootfs as a plain tar (for podman
// import) and as an OCI image archive (for ctr images import).
type image struct {
	rootfs string // rootfs.tar
	oci    string // oci.tar
}

// applets are linked to /bin/busybox in the image.
var applets = []string{"sh", "sleep", "ping", "nc", "httpd", "cat", "ip", "hostname", "true"}

// buildImage writes the image's two archives into dir from busybox.
func buildImage(busybox, dir string) (image, error) {
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return image{}, err
	}
	var files []ociimage.File
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "tmp", "www", "run", "var"} {
		files = append(files, ociimage.File{Name: d, Mode: 0o755, Dir: true})
	}
	files = append(files,
		ociimage.File{Name: "bin/busybox", Mode: 0o755, Data: bb},
		ociimage.File{Name: "www/index.html", Mode: 0o644, Data: []byte(indexHTML)},
		ociimage.File{Name: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/:/bin/sh\n")},
		ociimage.File{Name: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\n")},
	)
	for _, a := range applets {
		files = append(files, ociimage.File{Name: "bin/" + a, Link: "busybox", Mode: 0o777})
	}
	layer, err := ociimage.Layer(files)
	if err != nil {
		return image{}, err
	}
	img := image{rootfs: filepath.Join(dir, "rootfs.tar"), oci: filepath.Join(dir, "oci.tar")}
	if err := os.WriteFile(img.rootfs, layer, 0o644); err != nil {
		return image{}, err
	}
	archive, err := ociimage.Archive(ociimage.Image{Name: imageName, Layer: layer, Cmd: imageCmd, Env: []string{"PATH=/bin"}})
	if err != nil {
		return image{}, err
	}
	return img, os.WriteFile(img.oci, archive, 0o644)
}

// imageCmd is the image's command: a pause container for CRI, a long
// sleep for podman run without a command.
var imageCmd = []string{"/bin/sleep", "3600"}
