package doclimits

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadAndCheck(t *testing.T) {
	dir, err := os.MkdirTemp(filepath.Join(repoRoot(), "internal", "doclimits"), "tmp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	doc := "text\n\n| limit | value | note |\n|---|---|---|\n| `MaxConns` | 64 | closed |\n| `IdleTimeout` | 30s | dropped |\n| plain | 3 | not a limit |\n"
	path := filepath.Join(dir, "d.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(repoRoot(), path)
	got, err := Read(rel)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["MaxConns"] != "64" || got["IdleTimeout"] != "30s" {
		t.Fatalf("Read = %v", got)
	}
	Check(t, rel, map[string]any{"MaxConns": 64, "IdleTimeout": 30 * time.Second})

	rec := &recorder{TB: t}
	Check(rec, rel, map[string]any{"MaxConns": 65, "Missing": 1})
	if len(rec.errs) != 2 || !strings.Contains(rec.errs[0]+rec.errs[1], "65") {
		t.Fatalf("Check reported %q", rec.errs)
	}

	if err := os.WriteFile(path, []byte(doc+"| `MaxConns` | 1 | again |\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(rel); err == nil || !strings.Contains(err.Error(), "MaxConns") {
		t.Fatalf("a duplicate row: err = %v", err)
	}
}

type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, strings.TrimSpace(fmtSprintf(format, args...)))
}

var fmtSprintf = fmt.Sprintf
