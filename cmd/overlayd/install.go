package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/spf13/cobra"

	"github.com/overlaynet/overlay/internal/lib/atomicfile"
	"github.com/overlaynet/overlay/internal/printer"
)

// maxConflistSize bounds the conflist read: a CNI config is a few hundred
// bytes, and the file may come from anywhere a volume can.
const maxConflistSize = 1 << 20

// installFlags are the flags of `overlayd install-cni`.
type installFlags struct {
	binDir, confDir, plugin, conflist string
}

// newInstallCNICommand is the DaemonSet's install step as a subcommand, so
// the image needs no shell: it puts overlay-cni into the node's CNI binary
// directory and the conflist into its CNI config directory, each written
// whole and renamed into place so a runtime never reads half a file.
func newInstallCNICommand(g *GlobalFlags) *cobra.Command {
	f := &installFlags{}
	c := &cobra.Command{
		Use:   "install-cni",
		Short: "Install overlay-cni and its conflist on this host (the DaemonSet's init step)",
		Long: `install-cni copies the overlay-cni plugin into --cni-bin-dir and, with
--conflist, the network config list into --cni-conf-dir, each through a
temporary file renamed into place. The conflist is checked first: it must
parse as a CNI network config list with an overlay-cni plugin in it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format := g.out
			installed, err := f.install()
			if err != nil {
				return err
			}
			rows := make([][]string, len(installed))
			for i, p := range installed {
				rows[i] = []string{"installed", p}
			}
			return printer.Write(cmd.OutOrStdout(), format, printer.Output{Rows: rows, JSON: map[string][]string{"installed": installed}})
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.binDir, "cni-bin-dir", "/opt/cni/bin", "the CNI binary directory to install overlay-cni into")
	fs.StringVar(&f.confDir, "cni-conf-dir", "/etc/cni/net.d", "the CNI config directory to install --conflist into")
	fs.StringVar(&f.plugin, "plugin", "", "the overlay-cni binary to install (default: overlay-cni beside this overlayd)")
	fs.StringVar(&f.conflist, "conflist", "", "a CNI network config list to install under its own file name (none: the plugin only)")
	checkFlag(fs, "cni-bin-dir", absDir)
	checkFlag(fs, "cni-conf-dir", absDir)
	checkFlag(fs, "plugin", executableFile)
	checkFlag(fs, "conflist", regularFile)
	return c
}

func absDir(s string) error {
	if !filepath.IsAbs(s) {
		return errors.New("want an absolute directory path such as /opt/cni/bin")
	}
	if fi, err := os.Stat(s); err == nil && !fi.IsDir() {
		return errors.New("is not a directory")
	}
	return nil
}

func executableFile(s string) error {
	if fi, err := os.Stat(s); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return errors.New("want an executable file, such as the overlay-cni of this release")
	}
	return nil
}

func regularFile(s string) error {
	if fi, err := os.Stat(s); err != nil || !fi.Mode().IsRegular() {
		return errors.New("want a CNI network config list file, such as deploy/cni/10-overlay.conflist")
	}
	return nil
}

// install checks the inputs, then writes the plugin and the conflist, and
// returns the paths written.
func (f *installFlags) install() ([]string, error) {
	var bin []byte
	var err error
	if f.plugin != "" {
		bin, err = readPlugin(f.plugin)
	} else {
		bin, err = readDefaultPlugin()
	}
	if err != nil {
		return nil, err
	}
	var conf []byte
	if f.conflist != "" {
		if conf, err = readConflist(f.conflist); err != nil {
			return nil, err
		}
	}
	var installed []string
	for _, w := range []struct {
		dir, name string
		data      []byte
		perm      os.FileMode
	}{
		{f.binDir, "overlay-cni", bin, 0o755},
		{f.confDir, filepath.Base(f.conflist), conf, 0o644},
	} {
		if w.data == nil {
			continue
		}
		// atomicfile's errors name the path already (write
		// /opt/cni/bin/overlay-cni: …), and so do MkdirAll's when the
		// directory itself failed; one about a parent gets the directory.
		if err := os.MkdirAll(w.dir, 0o755); err != nil {
			var pe *fs.PathError
			if !errors.As(err, &pe) || pe.Path != w.dir {
				err = fmt.Errorf("create %s: %w", w.dir, err)
			}
			return installed, err
		}
		path := filepath.Join(w.dir, w.name)
		if err := atomicfile.Write(path, w.data, w.perm); err != nil {
			return installed, err
		}
		installed = append(installed, path)
	}
	return installed, nil
}

// readPlugin reads the --plugin binary, which must be a regular executable
// file (a bad value is a usage error, exit 2; a file that cannot be read is
// exit 1, and its error names it).
func readPlugin(path string) ([]byte, error) {
	if err := executableFile(path); err != nil {
		return nil, usagef("--plugin %s: %w", path, err)
	}
	return os.ReadFile(path)
}

// readDefaultPlugin reads the overlay-cni beside this overlayd. The user
// gave no --plugin, so its absence is no usage error (exit 1), and the
// message says where it was looked for and what to do.
func readDefaultPlugin() ([]byte, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find overlay-cni beside overlayd (%w): give --plugin", err)
	}
	path := filepath.Join(filepath.Dir(self), "overlay-cni")
	if executableFile(path) != nil {
		return nil, fmt.Errorf("no executable overlay-cni beside overlayd (%s): give --plugin", path)
	}
	return os.ReadFile(path)
}

// pluginConfig is what install-cni reads of a conflist's plugin.
type pluginConfig struct {
	Type string `json:"type"`
}

// readConflist reads a conflist and refuses one a runtime would refuse, or
// one that would not run overlay-cni. A missing file, or content that does
// not parse or lacks overlay-cni, is a usage error (exit 2: a bad value
// the user gave); a file that exists but cannot be read (EACCES, EIO) is
// exit 1.
func readConflist(path string) ([]byte, error) {
	file, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, usagef("--conflist: %w", err)
	} else if err != nil {
		return nil, fmt.Errorf("--conflist: %w", err)
	}
	defer file.Close()
	data, err := io.ReadAll(io.LimitReader(file, maxConflistSize+1))
	if err != nil {
		return nil, fmt.Errorf("--conflist: %w", err) // read PATH: …
	}
	if len(data) > maxConflistSize {
		return nil, usagef("--conflist: %s is larger than %d bytes", path, maxConflistSize)
	}
	// What a runtime's libcni needs to load the list, read without libcni:
	// its code would add to the resident size of every running overlayd.
	var list struct {
		CNIVersion string         `json:"cniVersion"`
		Name       string         `json:"name"`
		Plugins    []pluginConfig `json:"plugins"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, usagef("--conflist: %s is not a CNI network config list: %w", path, err)
	}
	if list.Name == "" || list.CNIVersion == "" {
		return nil, usagef("--conflist: %s is not a CNI network config list: it needs a name and a cniVersion", path)
	}
	if !slices.Contains(list.Plugins, pluginConfig{Type: "overlay-cni"}) {
		return nil, usagef("--conflist: %s has no plugin of type overlay-cni", path)
	}
	return data, nil
}
