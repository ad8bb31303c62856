// Package doclimits lets a package's tests hold the numbers its docs
// publish to the code: every limit a doc states in a limits table is read
// back and compared with the constant or default the code enforces, so the
// two cannot drift apart.
//
// A limits table is a Markdown table whose first column is a name in
// backticks and whose second column is the value, as the code would print
// it (a plain integer, or a Go duration such as 30s):
//
//	| limit | value | what happens past it |
//	|---|---|---|
//	| `MaxConns` | 64 | the connection is closed before it is read |
//
// Any other column is free text. A name may appear in only one row of one
// file.
//
// # Invariants
//
//   - [Read] returns every row whose first cell is exactly one backticked
//     name, mapped to its second cell as written, and refuses a file that
//     lists a name twice; it reads nothing else.
//   - [Check] compares text with text (fmt.Sprint of the code's value), so
//     a limit matches only when the doc prints it as the code would; every
//     name the test passes must be in the doc.
//   - Paths are relative to the module root, wherever the test runs.
//
// # Concurrency
//
// Read and Check may be called from parallel tests.
package doclimits

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Read returns the limits tables of the Markdown file at path (relative to
// the repository root): name to value, both as written.
func Read(path string) (map[string]string, error) {
	f, err := os.Open(filepath.Join(repoRoot(), path))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		cells := strings.Split(strings.TrimSpace(sc.Text()), "|")
		if len(cells) < 4 || cells[0] != "" {
			continue
		}
		name, value := strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2])
		if len(name) < 3 || name[0] != '`' || name[len(name)-1] != '`' || strings.Count(name, "`") != 2 {
			continue
		}
		name = name[1 : len(name)-1]
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%s:%d: limit %q listed twice", path, line, name)
		}
		out[name] = value
	}
	return out, sc.Err()
}

// Check fails t unless the doc at path lists every name of want with
// exactly its value (fmt.Sprint of it: an int, an int64, a time.Duration).
func Check(t testing.TB, path string, want map[string]any) {
	t.Helper()
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range want {
		w := fmt.Sprint(v)
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s lists no limit `%s` (the code has %s)", path, name, w)
		case g != w:
			t.Errorf("%s says `%s` is %s; the code has %s", path, name, g, w)
		}
	}
}

// repoRoot is the module root: the directory above this file's internal/.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
