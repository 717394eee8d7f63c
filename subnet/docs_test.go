package subnet

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// security.md's "What is validated where" table names this package's
// functions that exist, and its rows on the network config and on leases
// name every field of the config and every address and backend field of a
// lease value the checks read, IPv6 ones included (issue 28: the table was
// still IPv4-only and named a subnet.ParseKey that does not exist).
func TestSecurityValidationTableMatchesTheCode(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(data), "## What is validated where")
	if !ok {
		t.Fatal(`security.md has no section "What is validated where" any more: update this test`)
	}
	table, _, _ = strings.Cut(table, "\n## ")

	// The package's functions and methods, as "Name" and "Type.Name".
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string]bool{}
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok {
					continue
				}
				name := fd.Name.Name
				if fd.Recv != nil && len(fd.Recv.List) == 1 {
					typ := fd.Recv.List[0].Type
					if star, ok := typ.(*ast.StarExpr); ok {
						typ = star.X
					}
					if id, ok := typ.(*ast.Ident); ok {
						name = id.Name + "." + name
					}
				}
				funcs[name] = true
			}
		}
	}
	for _, m := range regexp.MustCompile("`subnet\\.([A-Za-z.]+)`").FindAllStringSubmatch(table, -1) {
		if !funcs[m[1]] {
			t.Errorf("security.md names subnet.%s, which does not exist", m[1])
		}
	}

	configRow := ""
	for _, line := range strings.Split(table, "\n") {
		if strings.Contains(line, "`subnet.ParseConfig`") {
			configRow = line
		}
	}
	if configRow == "" {
		t.Fatal("security.md's table has no row for subnet.ParseConfig")
	}
	configRow = regexp.MustCompile(`(\w+)Min/Max`).ReplaceAllString(configRow, "${1}Min ${1}Max")
	for _, typ := range []reflect.Type{reflect.TypeFor[rawConfig](), reflect.TypeFor[rawBackend]()} {
		for i := range typ.NumField() {
			if f := typ.Field(i).Name; !strings.Contains(strings.ToLower(configRow), strings.ToLower(f)) {
				t.Errorf("security.md's row on the network config does not say what is checked of %s", f)
			}
		}
	}
	for _, f := range []string{"PublicIP", "PublicIPv6", "BackendData", "BackendV6Data", "NodeID", "IPv6Network", "IPv6SubnetLen"} {
		if !strings.Contains(table, "`"+f+"`") {
			t.Errorf("security.md's table does not say how %s is checked", f)
		}
	}
}

// The out-of-subnets error names the config fields to change, of the
// pool's family, as etcd-schema.md quotes it (issue 28: it said "widen the
// network", and "SubnetMin/SubnetMax" for an IPv6 pool too).
func TestOutOfSubnetsNamesTheFieldsAsDocumented(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", "etcd-schema.md"))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ config, want string }{
		{`{"Network":"10.244.0.0/16"}`, "widen Network or the SubnetMin/SubnetMax range, or revoke stale leases"},
		{`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::100/120"}`, "widen IPv6Network or the IPv6SubnetMin/IPv6SubnetMax range, or revoke stale leases"},
	} {
		cfg := mustConfig(t, tc.config)
		p := cfg.Pool
		if !cfg.EnableIPv4 {
			p = cfg.IPv6
		}
		taken := map[netip.Prefix]bool{}
		for i := range p.Count() {
			taken[p.SubnetAt(i)] = true
		}
		_, err := p.PickFree(taken, rng)
		if !errors.Is(err, ErrOutOfSubnets) || !strings.HasSuffix(err.Error(), tc.want) {
			t.Errorf("%s, every subnet taken: %v; want it to end with %q", tc.config, err, tc.want)
		}
		if cfg.EnableIPv4 && !strings.Contains(string(data), "`"+err.Error()+"`") {
			t.Errorf("etcd-schema.md does not quote the error `%s`", err)
		}
	}
}
