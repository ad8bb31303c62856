package fuzz

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocsListEveryTarget keeps docs/fuzzing.md honest: its targets table
// must list every fuzz target in the module's test files, by package, and
// nothing else.
func TestDocsListEveryTarget(t *testing.T) {
	const root = ".."
	decl := regexp.MustCompile(`(?m)^func (Fuzz\w*)\(\w+ \*testing\.F\)`)
	var inCode []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		pkg = strings.TrimPrefix(strings.TrimPrefix(pkg, root), "/")
		if pkg == "" {
			pkg = "pagedkv"
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			inCode = append(inCode, pkg+" "+m[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	doc, err := os.ReadFile(filepath.Join(root, "docs", "fuzzing.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\| `(Fuzz\\w*)` \\|")
	var inDoc []string
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		inDoc = append(inDoc, m[1]+" "+m[2])
	}
	slices.Sort(inCode)
	slices.Sort(inDoc)
	for _, target := range inCode {
		if !slices.Contains(inDoc, target) {
			pkg, name, _ := strings.Cut(target, " ")
			t.Errorf("docs/fuzzing.md does not list %s; add a row: | `%s` | `%s` | <the invariant it checks> |", target, pkg, name)
		}
	}
	for _, target := range inDoc {
		if !slices.Contains(inCode, target) {
			t.Errorf("docs/fuzzing.md lists %s, which no test file declares", target)
		}
	}
	if len(inCode) < 12 {
		t.Errorf("found only %d fuzz targets (%v); the module promises at least 12", len(inCode), inCode)
	}
}
