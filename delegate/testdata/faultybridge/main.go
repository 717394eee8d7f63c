// Command faultybridge is a test delegate for overlay-cni: it runs the real
// bridge plugin (found in CNI_PATH) with the same configuration and
// environment, except that its DEL fails while the file named by the
// configuration's "faultFile" exists. The integration tests use it to make
// the delegate's DEL fail the way a real plugin does (a CNI error on stdout,
// exit status 1) and then to clear the fault.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

func main() {
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(5, "faultybridge: read stdin: "+err.Error())
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		FaultFile  string `json:"faultFile"`
	}
	_ = json.Unmarshal(stdin, &conf)
	if os.Getenv("CNI_COMMAND") == "DEL" && conf.FaultFile != "" {
		if _, err := os.Stat(conf.FaultFile); err == nil {
			fail(5, "faultybridge: injected DEL failure (remove "+conf.FaultFile+" to clear it)")
		}
	}
	bridge := ""
	for _, dir := range filepath.SplitList(os.Getenv("CNI_PATH")) {
		p := filepath.Join(dir, "bridge")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			bridge = p
			break
		}
	}
	if bridge == "" {
		fail(5, "faultybridge: no bridge plugin in CNI_PATH")
	}
	cmd := exec.Command(bridge)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			os.Exit(ee.ExitCode())
		}
		fail(5, "faultybridge: run bridge: "+err.Error())
	}
}

func fail(code int, msg string) {
	out, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "code": code, "msg": msg})
	fmt.Println(string(out))
	os.Exit(1)
}
