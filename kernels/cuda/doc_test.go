package cuda

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// entryRow is one row of the entry-point table in doc.go.
type entryRow struct {
	entry, source, goCode, test string
}

var (
	entryRowRE = regexp.MustCompile(`^//\t([a-z0-9_]+) +([a-z0-9_]+\.cu) +(\S.*?) +((?:cpuemu\.)?Test\w+)$`)
	mapRowRE   = regexp.MustCompile(`^//\t([a-z0-9_]+\.cu) +(.*)$`)
	testFuncRE = regexp.MustCompile(`(?m)^func (Test\w+)\(`)
)

// docTables reads doc.go's entry-point table and the sources of its map
// (source -> whether the map marks an sm_90 build).
func docTables(t *testing.T) ([]entryRow, map[string]bool) {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	var rows []entryRow
	sources := map[string]bool{}
	for _, line := range strings.Split(string(src), "\n") {
		if m := entryRowRE.FindStringSubmatch(line); m != nil {
			rows = append(rows, entryRow{m[1], m[2], m[3], m[4]})
		} else if m := mapRowRE.FindStringSubmatch(line); m != nil {
			sources[m[1]] = strings.HasSuffix(m[2], "+ sm_90")
		}
	}
	return rows, sources
}

// goNames lists the functions ("name") and methods ("Recv.name") declared
// in the non-test Go files of dir, whatever their build tags.
func goNames(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	names := map[string]bool{}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		require.NoError(t, err, file)
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			name := fn.Name.Name
			if fn.Recv != nil {
				typ := fn.Recv.List[0].Type
				if star, ok := typ.(*ast.StarExpr); ok {
					typ = star.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					name = id.Name + "." + name
				}
			}
			names[name] = true
		}
	}
	return names
}

// testNames lists the Test functions of the _test.go files of dir.
func testNames(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	require.NoError(t, err)
	names := map[string]bool{}
	for _, file := range files {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range testFuncRE.FindAllStringSubmatch(string(src), -1) {
			names[m[1]] = true
		}
	}
	return names
}

// The entry-point table of doc.go lists every .entry of the embedded PTX
// exactly once and nothing else, each with the .cu its PTX is built from,
// Go functions that exist and a test that exists; its map names every .cu
// and marks exactly the sources that have an sm_90 build.
func TestEntryPointTable(t *testing.T) {
	rows, sources := docTables(t)
	require.NotEmpty(t, rows, "no entry-point rows parsed from doc.go")

	inPTX := map[string]string{} // entry -> source
	for file, ptx := range Modules {
		for _, m := range entryRE.FindAllStringSubmatch(ptx, -1) {
			inPTX[m[1]] = strings.TrimSuffix(file, ".ptx") + ".cu"
		}
	}
	inTable := map[string]bool{}
	goCode := goNames(t, ".")
	tests := map[string]map[string]bool{"": testNames(t, "."), "cpuemu.": testNames(t, "../../internal/cpuemu")}
	for _, r := range rows {
		assert.False(t, inTable[r.entry], "%s is listed twice", r.entry)
		inTable[r.entry] = true
		src, ok := inPTX[r.entry]
		if assert.True(t, ok, "%s is in the table but in no PTX module", r.entry) {
			assert.Equal(t, src, r.source, "%s: source", r.entry)
		}
		for _, name := range strings.Split(r.goCode, " → ") {
			assert.True(t, goCode[name], "%s: no Go function %q", r.entry, name)
		}
		pkg, name := "", r.test
		if strings.HasPrefix(name, "cpuemu.") {
			pkg, name = "cpuemu.", strings.TrimPrefix(name, "cpuemu.")
		}
		assert.True(t, tests[pkg][name], "%s: no test %s", r.entry, r.test)
	}
	for entry := range inPTX {
		assert.True(t, inTable[entry], "%s is in the PTX but not in doc.go's table", entry)
	}

	cu, err := fs.Glob(Sources, "*.cu")
	require.NoError(t, err)
	var mapped []string
	for src, sm90 := range sources {
		mapped = append(mapped, src)
		_, has := sm90Builds[strings.TrimSuffix(src, ".cu")+".ptx"]
		assert.Equal(t, has, sm90, "%s: doc.go's map and sm90Builds disagree on its sm_90 build", src)
	}
	sort.Strings(mapped)
	assert.Equal(t, cu, mapped, "the .cu files vs doc.go's map")
}
