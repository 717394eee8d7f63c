package masq

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// kernelHint explains an install the kernel refused as an unsupported
// feature. NAT in an inet table came with Linux 5.2; distributions may have
// backported it, so the version alone decides nothing.
func kernelHint(release string) string {
	const need = "it needs nf_tables NAT in family inet: Linux 5.2 or later with CONFIG_NF_TABLES_INET, CONFIG_NFT_NAT and CONFIG_NFT_MASQ, built in or loadable"
	if major, minor, ok := kernelVersion(release); ok && (major < 5 || major == 5 && minor < 2) {
		return fmt.Sprintf("this kernel, %s, is older than 5.2: %s", release, need)
	}
	return fmt.Sprintf("the kernel (%s) lacks an nf_tables feature: %s", release, need)
}

// kernelRelease returns the running kernel's release, e.g. "6.1.0-18-amd64".
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "release unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// kernelVersion parses the major and minor version of a kernel release.
func kernelVersion(release string) (major, minor int, ok bool) {
	fields := strings.SplitN(release, ".", 3)
	if len(fields) < 2 {
		return 0, 0, false
	}
	major, err := strconv.Atoi(fields[0])
	if err != nil {
		return 0, 0, false
	}
	digits := strings.IndexFunc(fields[1], func(r rune) bool { return r < '0' || r > '9' })
	if digits < 0 {
		digits = len(fields[1])
	}
	minor, err = strconv.Atoi(fields[1][:digits])
	if err != nil {
		return 0, 0, false
	}
	return major, minor, true
}
