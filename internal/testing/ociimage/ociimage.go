// Package ociimage writes container images without a registry: a layer
// from a list of files, and an OCI image layout packed in a tar that
// `ctr images import` (containerd) takes as it is. Each image is one
// uncompressed layer and a config; several images may share a layer. The
// runtime and Kubernetes suites build their test images with it.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// File is one entry of a layer: a directory (Dir), a symbolic link (Link)
// or a regular file (Data).
type File struct {
	Name string // relative, e.g. "bin/sh"
	Mode int64
	Dir  bool
	Link string
	Data []byte
}

// Layer is an uncompressed tar of files, in order, with fixed times (the
// same files give the same digest).
func Layer(files []File) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range files {
		h := &tar.Header{Name: f.Name, Mode: f.Mode, ModTime: time.Unix(0, 0)}
		switch {
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, f.Name+"/"
		case f.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", f.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Image is one image of an archive.
type Image struct {
	Name       string // e.g. "localhost/test:v1"; the tag is its ref name
	Layer      []byte // from Layer
	Entrypoint []string
	Cmd        []string
	Env        []string
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    map[string]string `json:"platform,omitempty"`
}

// Archive packs images into one OCI image layout in a tar (linux/amd64),
// each named by the io.containerd.image.name annotation containerd's
// import reads.
func Archive(images ...Image) ([]byte, error) {
	blobs := map[string][]byte{}
	blob := func(mediaType string, data []byte) descriptor {
		sum := sha256.Sum256(data)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = data
		return descriptor{MediaType: mediaType, Digest: d, Size: len(data)}
	}
	var manifests []descriptor
	for _, img := range images {
		if img.Name == "" || len(img.Layer) == 0 {
			return nil, fmt.Errorf("image %q: a name and a layer are needed", img.Name)
		}
		layer := blob("application/vnd.oci.image.layer.v1.tar", img.Layer)
		cfg := map[string]any{"Env": img.Env}
		if img.Env == nil {
			cfg["Env"] = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
		}
		if img.Entrypoint != nil {
			cfg["Entrypoint"] = img.Entrypoint
		}
		if img.Cmd != nil {
			cfg["Cmd"] = img.Cmd
		}
		config, err := json.Marshal(map[string]any{
			"architecture": "amd64", "os": "linux", "config": cfg,
			"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layer.Digest}},
		})
		if err != nil {
			return nil, err
		}
		manifest, err := json.Marshal(map[string]any{
			"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
			"config": blob("application/vnd.oci.image.config.v1+json", config),
			"layers": []descriptor{layer},
		})
		if err != nil {
			return nil, err
		}
		md := blob("application/vnd.oci.image.manifest.v1+json", manifest)
		tag := "latest"
		if i := bytes.LastIndexByte([]byte(img.Name), ':'); i > bytes.LastIndexByte([]byte(img.Name), '/') {
			tag = img.Name[i+1:]
		}
		md.Annotations = map[string]string{"io.containerd.image.name": img.Name, "org.opencontainers.image.ref.name": tag}
		md.Platform = map[string]string{"architecture": "amd64", "os": "linux"}
		manifests = append(manifests, md)
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": manifests})
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
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	slices.Sort(digests)
	for _, d := range digests {
		if err := put("blobs/sha256/"+d[len("sha256:"):], blobs[d]); err != nil {
			return nil, fmt.Errorf("blob %s: %w", d, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
