// Package atomicfile writes files so that a reader, or the next process after a
// crash, sees either the old complete file or the new complete file — never an
// empty or half-written one. subnet.env and the CNI cache both rely on this:
// a truncated file there would make every later DEL fail to parse.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data: it writes a temporary file in the same
// directory, fsyncs it, renames it over path and fsyncs the directory so the
// rename itself survives a power loss.
func Write(path string, data []byte, perm os.FileMode) (err error) {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Sync(); err != nil {
		return failed("write", path, err)
	}
	if err = tmp.Close(); err != nil {
		return failed("write", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return failed("replace", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// ErrExist is Publish's error for a path that exists. It is its own
// error, not fs.ErrExist, which a failing mkdir of the directory returns
// too (a dangling symbolic link, say): only this one means "someone
// created the file first".
var ErrExist = errors.New("file already exists")

// Pending is a file published by Publish whose contents and name are not yet
// known to be on stable storage.
type Pending struct {
	f    *os.File
	path string
}

// Publish creates path with data, in two steps, for a caller that can
// overlap the slow part (the fsyncs, about a millisecond on an ordinary
// disk) with other work. When it returns, path holds data as one complete
// file for every process that opens it. Only after Sync returns nil does it
// also survive a power loss; a power loss before that may leave path
// missing or empty, so the caller must not report the file as saved until
// then, and its readers must treat an empty file as unusable.
//
// Unlike Write it never replaces a file: if path exists, even one created
// a moment earlier by another process, it fails with an error wrapping
// ErrExist (the temporary file is linked to path, which the kernel does
// only if path does not exist).
func Publish(path string, data []byte, perm os.FileMode) (*Pending, error) {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return nil, err
	}
	err = os.Link(tmp.Name(), path)
	_ = os.Remove(tmp.Name()) // path, if linked, keeps the data
	if err != nil {
		_ = tmp.Close()
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("create %s: %w", path, ErrExist)
		}
		return nil, failed("create", path, err)
	}
	return &Pending{f: tmp, path: path}, nil
}

// Sync makes the published file durable: it fsyncs the file's data and its
// directory. It must be called exactly once.
func (p *Pending) Sync() error {
	serr := p.f.Sync()
	cerr := p.f.Close()
	if err := errors.Join(serr, cerr); err != nil {
		return fmt.Errorf("sync %s: %w", p.path, err)
	}
	return syncDir(filepath.Dir(p.path))
}

// writeTemp writes data with mode perm to a new temporary file next to path
// and returns it open.
func writeTemp(path string, data []byte, perm os.FileMode) (_ *os.File, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, failed("write", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(perm); err != nil {
		return nil, failed("write", path, err)
	}
	if _, err = tmp.Write(data); err != nil {
		return nil, failed("write", path, err)
	}
	return tmp, nil
}

// failed is the error of op on path, the file being written, with the
// cause only: the temporary file is an implementation detail, gone by the
// time anyone reads the message, and naming it beside path (as os's own
// errors do) said the same thing twice. "write /run/overlay/subnet.env:
// no space left on device" wraps ENOSPC.
func failed(op, path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		err = le.Err
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
