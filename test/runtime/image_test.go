package runtimee2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
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
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	mtime := time.Unix(0, 0)
	add := func(h *tar.Header, data []byte) error {
		h.ModTime = mtime
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "tmp", "www", "run", "var"} {
		if err := add(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}, nil); err != nil {
			return image{}, err
		}
	}
	files := []struct {
		name string
		mode int64
		data []byte
	}{
		{"bin/busybox", 0o755, bb},
		{"www/index.html", 0o644, []byte(indexHTML)},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/:/bin/sh\n")},
		{"etc/group", 0o644, []byte("root:x:0:\n")},
	}
	for _, f := range files {
		if err := add(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode}, f.data); err != nil {
			return image{}, err
		}
	}
	for _, a := range applets {
		if err := add(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777}, nil); err != nil {
			return image{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return image{}, err
	}
	img := image{rootfs: filepath.Join(dir, "rootfs.tar"), oci: filepath.Join(dir, "oci.tar")}
	if err := os.WriteFile(img.rootfs, layer.Bytes(), 0o644); err != nil {
		return image{}, err
	}
	archive, err := ociArchive(layer.Bytes())
	if err != nil {
		return image{}, err
	}
	return img, os.WriteFile(img.oci, archive, 0o644)
}

// imageCmd is the image's command: a pause container for CRI, a long
// sleep for podman run without a command.
var imageCmd = []string{"/bin/sleep", "3600"}

// ociArchive packs an OCI image layout (one uncompressed layer) into a tar,
// named imageName for containerd.
func ociArchive(layer []byte) ([]byte, error) {
	type descriptor struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
		Platform    map[string]string `json:"platform,omitempty"`
	}
	blobs := map[string][]byte{}
	blob := func(mediaType string, data []byte) descriptor {
		sum := sha256.Sum256(data)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = data
		return descriptor{MediaType: mediaType, Digest: d, Size: len(data)}
	}
	layerDesc := blob("application/vnd.oci.image.layer.v1.tar", layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Cmd": imageCmd, "Env": []string{"PATH=/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return nil, err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": blob("application/vnd.oci.image.config.v1+json", config),
		"layers": []descriptor{layerDesc},
	})
	if err != nil {
		return nil, err
	}
	md := blob("application/vnd.oci.image.manifest.v1+json", manifest)
	md.Annotations = map[string]string{"io.containerd.image.name": imageName, "org.opencontainers.image.ref.name": "latest"}
	md.Platform = map[string]string{"architecture": "amd64", "os": "linux"}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []descriptor{md}})
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	put := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return nil, err
	}
	if err := put("index.json", index); err != nil {
		return nil, err
	}
	for d, data := range blobs {
		if err := put("blobs/sha256/"+d[len("sha256:"):], data); err != nil {
			return nil, fmt.Errorf("blob %s: %w", d, err)
		}
	}
	return out.Bytes(), tw.Close()
}
