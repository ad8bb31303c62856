package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestEveryExportIsGuarded reads this package's source: every function
// exported to C must start with the guard that keeps a Go panic from
// crossing the boundary, either `defer recoverTo(&code)` or
//
//	h, code := enter(id, "op")
//	if h == nil { return code }
//	defer h.exit(&code)
//
// (enter only looks the handle up; nothing before the defer can panic;
// enterDense and enterHybrid are enter with a check of the handle's kind,
// enterTiers and enterEvents with a check of what it was made with).
// It also checks that pagedkv.h declares exactly the exported functions,
// less the two test hooks, plus the two written in C (errbuf.c).
func TestEveryExportIsGuarded(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Doc == nil || !hasExportLine(fn.Doc, fn.Name.Name) {
				continue
			}
			exported[fn.Name.Name] = true
			if why := guardProblem(fn); why != "" {
				t.Errorf("%s: %s: %s", fset.Position(fn.Pos()), fn.Name.Name, why)
			}
		}
	}
	if len(exported) < 20 {
		t.Fatalf("found only %d exported functions: %v", len(exported), exported)
	}

	header, err := os.ReadFile("pagedkv.h")
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^int32_t (pagedkv_\w+)\(|^const char \*(pagedkv_\w+)\(`).FindAllSubmatch(header, -1) {
		declared[string(m[1])+string(m[2])] = true
	}
	inC := map[string]bool{"pagedkv_abi_version": true, "pagedkv_last_error": true}
	hooks := map[string]bool{"pagedkv_debug_panic": true, "pagedkv_bench_decode_steps": true}
	for name := range declared {
		if !exported[name] && !inC[name] {
			t.Errorf("pagedkv.h declares %s, which nothing exports", name)
		}
	}
	for name := range exported {
		if !declared[name] && !hooks[name] {
			t.Errorf("%s is exported but not declared in pagedkv.h", name)
		}
	}
}

func hasExportLine(doc *ast.CommentGroup, name string) bool {
	for _, c := range doc.List {
		if c.Text == "//export "+name {
			return true
		}
	}
	return false
}

// guardProblem says what is wrong with fn's guard, or "".
func guardProblem(fn *ast.FuncDecl) string {
	res := fn.Type.Results
	if res == nil || len(res.List) != 1 || len(res.List[0].Names) != 1 || res.List[0].Names[0].Name != "code" {
		return "the result must be the named code (so that a deferred recover can set it)"
	}
	body := fn.Body.List
	if len(body) == 0 {
		return "empty body"
	}
	if isDeferCall(body[0], "recoverTo") {
		return ""
	}
	as, ok := body[0].(*ast.AssignStmt)
	if !ok || len(as.Rhs) != 1 || !slices.ContainsFunc([]string{"enter", "enterDense", "enterHybrid", "enterTiers", "enterEvents"},
		func(name string) bool { return isCall(as.Rhs[0], name) }) {
		return "first statement is neither `defer recoverTo(&code)` nor `h, code := enter(...)` (or enterDense, enterHybrid, enterTiers, enterEvents)"
	}
	if len(body) < 3 {
		return "enter is not followed by `if h == nil { return code }` and `defer h.exit(&code)`"
	}
	if _, ok := body[1].(*ast.IfStmt); !ok {
		return "enter is not followed by `if h == nil { return code }`"
	}
	if !isDeferCall(body[2], "exit") {
		return "the third statement is not `defer h.exit(&code)`"
	}
	return ""
}

func isDeferCall(s ast.Stmt, name string) bool {
	d, ok := s.(*ast.DeferStmt)
	return ok && isCall(d.Call, name)
}

func isCall(e ast.Expr, name string) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	switch f := c.Fun.(type) {
	case *ast.Ident:
		return f.Name == name
	case *ast.SelectorExpr:
		return f.Sel.Name == name
	}
	return false
}
