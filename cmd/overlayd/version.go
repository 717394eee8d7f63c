package main

import (
	"fmt"
	"runtime"

	"github.com/overlaynet/overlay/internal/printer"
	"github.com/overlaynet/overlay/internal/version"
	"github.com/spf13/cobra"
)

// versionInfo is what `overlayd version -w json` prints.
type versionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"` // GOOS/GOARCH
}

func newVersionCommand(g *GlobalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version (-w json or simple: version, Go version, platform)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format := g.out
			v := versionInfo{version.String(), runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH}
			if format == printer.Table {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "overlayd %s (%s, %s)\n", v.Version, v.GoVersion, v.Platform)
				return err
			}
			return printer.Write(cmd.OutOrStdout(), format, printer.Output{Rows: [][]string{{v.Version, v.GoVersion, v.Platform}}, JSON: v})
		},
	}
}
