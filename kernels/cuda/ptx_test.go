package cuda

import (
	"io/fs"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ModulesFor picks the sm_90 builds from compute capability 9.0 on (the
// sm_80 build of a module that has none) and the sm_80 builds below it;
// both sets have the same files and the same entry points with the same
// parameter lists, so the launcher needs no change.
func TestModulesForPicksTheBuildByComputeCapability(t *testing.T) {
	for _, c := range []struct{ major, minor int }{{8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}, {12, 0}} {
		mods := ModulesFor(c.major, c.minor)
		require.Len(t, mods, len(Modules))
		for file, ptx := range mods {
			target := ".target sm_80"
			if _, ok := sm90Builds[file]; ok && c.major >= 9 {
				target = ".target sm_90"
			}
			assert.Contains(t, ptx, target, "%d.%d %s", c.major, c.minor, file)
		}
	}
	for file, ptx80 := range Modules {
		ptx90, ok := modulesSM90[file]
		require.True(t, ok, file)
		assert.Equal(t, entryRE.FindAllString(ptx80, -1), entryRE.FindAllString(ptx90, -1), file)
		for _, bad := range []string{"/work", "/root", "/home", "/tmp", ".file"} {
			assert.NotContains(t, ptx90, bad, file)
		}
	}
}

// ptx/ holds exactly the embedded modules: <k>.ptx for every <k>.cu, and
// <k>_sm90.ptx only where the sm_90 build differs from the sm_80 one in
// more than its .target line (the rule scripts/nvcc.sh applies; an sm_90
// build identical but for .target is not kept, the sm_80 PTX serves sm_90).
func TestPTXFilesAreTheEmbeddedModules(t *testing.T) {
	var want []string
	for file := range Modules {
		want = append(want, file)
	}
	for file := range sm90Builds {
		want = append(want, strings.TrimSuffix(file, ".ptx")+"_sm90.ptx")
	}
	sort.Strings(want)
	dir, err := os.ReadDir("ptx")
	require.NoError(t, err)
	var got []string
	for _, e := range dir {
		got = append(got, e.Name())
	}
	assert.Equal(t, want, got, "files in ptx/ vs the embedded modules")

	sources, err := fs.Glob(Sources, "*.cu")
	require.NoError(t, err)
	var fromSources []string
	for _, src := range sources {
		fromSources = append(fromSources, strings.TrimSuffix(src, ".cu")+".ptx")
	}
	var modules []string
	for file := range Modules {
		modules = append(modules, file)
	}
	sort.Strings(modules)
	assert.Equal(t, fromSources, modules, "one sm_80 module per .cu")

	for file, ptx90 := range sm90Builds {
		require.Contains(t, ptx90, ".target sm_90\n", file)
		assert.NotEqual(t, Modules[file], strings.Replace(ptx90, ".target sm_90\n", ".target sm_80\n", 1),
			"%s: the sm_90 build differs only in .target; scripts/nvcc.sh would not keep it", file)
	}
}

// The sm_90 decode widens e4m3 K/V with the packed hardware convert (e5m2
// keeps its one-shift scalar widening: see KvE5M2 in compat.cuh); the
// sm_80 build, where the convert does not exist, has none.
func TestSM90DecodeUsesPackedFP8Converts(t *testing.T) {
	const cvt = "cvt.rn.f16x2.e4m3x2"
	assert.Contains(t, modulesSM90["decode.ptx"], cvt)
	for file, ptx := range Modules {
		assert.False(t, strings.Contains(ptx, cvt), "%s has %s", file, cvt)
	}
}
