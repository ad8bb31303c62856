package cuda

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ModulesFor picks the sm_90 build from compute capability 9.0 on and the
// sm_80 build below it; both builds have the same files and the same entry
// points with the same parameter lists, so the launcher needs no change.
func TestModulesForPicksTheBuildByComputeCapability(t *testing.T) {
	for _, c := range []struct{ major, minor int }{{8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}, {12, 0}} {
		target := ".target sm_80"
		if c.major >= 9 {
			target = ".target sm_90"
		}
		mods := ModulesFor(c.major, c.minor)
		require.Len(t, mods, len(Modules))
		for file, ptx := range mods {
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
