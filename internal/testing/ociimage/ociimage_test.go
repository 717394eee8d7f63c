package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// untar reads a tar into name -> content.
func untar(t *testing.T, data []byte) (map[string][]byte, map[string]*tar.Header) {
	t.Helper()
	files, headers := map[string][]byte{}, map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, headers
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name], headers[h.Name] = b, h
	}
}

// What containerd's import reads: index.json names each image by its
// annotation and tag, and every digest on the way to the layer is the
// sha256 of a blob in the archive; the layer holds the files as given.
func TestArchiveIsAnImportableLayout(t *testing.T) {
	layer, err := Layer([]File{
		{Name: "usr", Mode: 0o755, Dir: true},
		{Name: "usr/bin/tool", Mode: 0o755, Data: []byte("#!binary")},
		{Name: "usr/bin/alias", Mode: 0o777, Link: "tool"},
	})
	if err != nil {
		t.Fatal(err)
	}
	archive, err := Archive(
		Image{Name: "localhost/a:v1", Layer: layer, Entrypoint: []string{"/usr/bin/tool"}},
		Image{Name: "localhost:5000/b", Layer: layer, Cmd: []string{"x"}},
	)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := untar(t, archive)
	if !strings.Contains(string(files["oci-layout"]), `"imageLayoutVersion":"1.0.0"`) {
		t.Fatalf("oci-layout: %q", files["oci-layout"])
	}
	blob := func(d descriptor) []byte {
		t.Helper()
		data, ok := files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		sum := sha256.Sum256(data)
		if !ok || "sha256:"+hex.EncodeToString(sum[:]) != d.Digest || len(data) != d.Size {
			t.Fatalf("blob %s: present %v, size %d want %d", d.Digest, ok, len(data), d.Size)
		}
		return data
	}
	var index struct{ Manifests []descriptor }
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"localhost/a:v1": "v1", "localhost:5000/b": "latest"}
	if len(index.Manifests) != len(want) {
		t.Fatalf("%d manifests, want %d", len(index.Manifests), len(want))
	}
	for _, m := range index.Manifests {
		name := m.Annotations["io.containerd.image.name"]
		if tag, ok := want[name]; !ok || m.Annotations["org.opencontainers.image.ref.name"] != tag {
			t.Errorf("manifest annotations %v", m.Annotations)
		}
		var man struct {
			Config descriptor
			Layers []descriptor
		}
		if err := json.Unmarshal(blob(m), &man); err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Rootfs struct {
				DiffIDs []string `json:"diff_ids"`
			}
		}
		if err := json.Unmarshal(blob(man.Config), &cfg); err != nil {
			t.Fatal(err)
		}
		if len(man.Layers) != 1 || len(cfg.Rootfs.DiffIDs) != 1 || cfg.Rootfs.DiffIDs[0] != man.Layers[0].Digest {
			t.Fatalf("%s: layers %v, diff_ids %v", name, man.Layers, cfg.Rootfs.DiffIDs)
		}
		layerFiles, headers := untar(t, blob(man.Layers[0]))
		if string(layerFiles["usr/bin/tool"]) != "#!binary" || headers["usr/bin/alias"].Linkname != "tool" || headers["usr/"].Typeflag != tar.TypeDir {
			t.Fatalf("%s: layer entries %v", name, headers)
		}
	}
}

func TestArchiveRefusesAnImageWithoutNameOrLayer(t *testing.T) {
	for _, img := range []Image{{Layer: []byte("x")}, {Name: "localhost/a:v1"}} {
		if _, err := Archive(img); err == nil {
			t.Errorf("Archive(%+v): no error", img)
		}
	}
}
