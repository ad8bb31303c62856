package main

import (
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBenchShort(t *testing.T) {
	code, out, errOut := runCLI("bench", "--short")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	ls := lines(out)
	names := benchNames(shortSizes)
	require.Len(t, ls, len(names)+2, out)
	assert.Regexp(t, `^benchmark +ours +allocs/op +baseline +ratio +baseline is$`, ls[0])
	for i, name := range names {
		row := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + ` +(\S+ (ns/\w+|GB/s)) +(\d+) +(\S+ (ns/\w+|GB/s)) +(\d+\.\d\d)x  \S.*$`)
		m := row.FindStringSubmatch(ls[i+1])
		if assert.NotNil(t, m, "row %d %q", i, ls[i+1]) {
			assert.Equal(t, m[2], m[5], "ours and the baseline in one unit: %q", ls[i+1])
		}
	}
	assert.Contains(t, ls[len(ls)-1], "ratio = our time / the baseline's time")
	assert.Equal(t, []string{
		"alloc+free, batch 16",
		"alloc+free, 1 page, owner-local Cache",
		"decode step, Manager, 16 requests",
		"decode step, Manager, 64 requests",
		"CSR export, 16 x 256 tokens",
		"append, cpu, 16 rows f16 NHD",
		"append, cpu, 16 rows f16 HND",
		"decode, cpu, 1 worker, 2 x 64 tokens f16",
		"decode, cpu, 2 workers, 2 x 64 tokens f16",
		"prefix lookup, 256 tokens",
	}, names)
}

// TestBenchFailure: a benchmark's error reaches the caller (bench prints
// the row as FAILED and exits 1; TestBenchShort sees every row pass).
func TestBenchFailure(t *testing.T) {
	restore, err := setBenchtime(time.Millisecond)
	require.NoError(t, err)
	defer restore()
	boom := errors.New("boom")
	_, err = runOne(func(*testing.B) error { return boom })
	assert.ErrorIs(t, err, boom)
	r, err := runOne(func(b *testing.B) error {
		for range b.N {
		}
		return nil
	})
	assert.NoError(t, err)
	assert.Positive(t, r.N)
}

func TestBenchBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--benchtime", "0s"}, {"--benchtime", "1000h"}, {"--benchtime", "x"}, {"extra"}} {
		code, out, _ := runCLI(append([]string{"bench"}, args...)...)
		assert.Equal(t, exitUsage, code, "%v", args)
		assert.Empty(t, out)
	}
}
