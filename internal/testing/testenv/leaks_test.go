package testenv

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryProgramGetsAControlledEnvironment (issue 34) reads the tests
// and the test helpers and refuses the ways a program they run inherits
// this process's environment (a caller's OVERLAY_*, FLANNELD_*, CNI_*...):
// invoke.ExecPlugin* or libcni with a nil exec (libcni then hands the
// plugin os.Environ()), os.Environ() or cmd.Environ() (only ProgramEnv
// may read it), overlayd's execute (which reads os.Environ(); tests use
// executeEnv), and an exec.Command whose function sets no Env.
func TestEveryProgramGetsAControlledEnvironment(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	var found []string
	report := func(fset *token.FileSet, n ast.Node, format string) {
		found = append(found, fset.Position(n.Pos()).String()+": "+format)
	}
	for _, dir := range []string{"cmd", "delegate", "test", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			inTests := strings.HasSuffix(path, "_test.go") || strings.Contains(filepath.ToSlash(path), "internal/testing/")
			if d.IsDir() || !strings.HasSuffix(path, ".go") || !inTests {
				return nil
			}
			if filepath.Base(filepath.Dir(path)) == "testenv" && !strings.HasSuffix(path, "_test.go") {
				return nil // ProgramEnv and CNIExec themselves
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				setsEnv := false
				var commands []ast.Node
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.AssignStmt:
						for _, l := range n.Lhs {
							if sel, ok := l.(*ast.SelectorExpr); ok && sel.Sel.Name == "Env" {
								setsEnv = true
							}
						}
					case *ast.CallExpr:
						name := callName(n.Fun)
						last := ""
						if len(n.Args) > 0 {
							if id, ok := n.Args[len(n.Args)-1].(*ast.Ident); ok {
								last = id.Name
							}
						}
						switch {
						case (name == "invoke.ExecPluginWithResult" || name == "invoke.ExecPluginWithoutResult" ||
							name == "libcni.NewCNIConfigWithCacheDir") && last == "nil":
							report(fset, n, name+" with a nil exec: pass testenv.CNIExec")
						case name == "libcni.NewCNIConfig":
							report(fset, n, name+" runs plugins with os.Environ(): use NewCNIConfigWithCacheDir with testenv.CNIExec")
						case strings.HasSuffix(name, ".Environ"):
							report(fset, n, name+"(): build the environment with testenv.ProgramEnv")
						case name == "execute" && f.Name.Name == "main":
							report(fset, n, "execute reads os.Environ(): use executeEnv with testenv.ProgramEnv")
						case name == "exec.Command" || name == "exec.CommandContext":
							commands = append(commands, n)
						}
					}
					return true
				})
				if !setsEnv {
					for _, c := range commands {
						report(fset, c, "exec.Command in a function that sets no Env: set it from testenv.ProgramEnv")
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range found {
		t.Error(f)
	}
}

// callName is "pkg.Func", "x.Method" or "Func" for a call's function.
func callName(fun ast.Expr) string {
	switch f := fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		if x, ok := f.X.(*ast.Ident); ok {
			return x.Name + "." + f.Sel.Name
		}
		return "?." + f.Sel.Name // a.b.Method
	}
	return ""
}
