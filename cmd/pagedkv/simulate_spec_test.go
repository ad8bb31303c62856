package main

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSimulateSpecTokens: --spec-tokens 4 verifies (draft rows included)
// and accepts some drafts but not all; the run without the flag prints no
// speculative line. (internal/sim's TestSpeculativeMatchesPlain checks
// that the tokens generated are those of the run without drafts.)
func TestSimulateSpecTokens(t *testing.T) {
	args := append([]string{"simulate", "--requests", "10", "--pages", "24", "--quiet", "--verify-every", "1"}, smallModel...)
	code, out, errOut := runCLI(append(args, "--spec-tokens", "4")...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	m := regexp.MustCompile(`^k=4, (\d+) drafts proposed, (\d+) accepted \((\d+\.\d)%\)$`).FindStringSubmatch(summaryField(t, out, "speculative"))
	require.NotNil(t, m, out)
	drafts, _ := strconv.Atoi(m[1])
	accepted, _ := strconv.Atoi(m[2])
	assert.Positive(t, accepted)
	assert.Less(t, accepted, drafts)
	v := regexp.MustCompile(`^passed: \d+ outputs \((\d+) of draft rows\)`).FindStringSubmatch(summaryField(t, out, "verification"))
	require.NotNil(t, v, out)
	n, _ := strconv.Atoi(v[1])
	assert.Positive(t, n)

	// Same workload without drafts: same requests and output tokens, and
	// no speculative line.
	code, plain, errOut := runCLI(args...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", plain, errOut)
	assert.Equal(t, summaryField(t, plain, "requests"), summaryField(t, out, "requests"))
	assert.NotRegexp(t, `(?m)^speculative:`, plain)
}

func TestSimulateSpecTokensBad(t *testing.T) {
	for _, v := range []string{"-1", "17", "x"} {
		code, _, errOut := runCLI("simulate", "--quiet", "--spec-tokens", v)
		assert.Equal(t, exitUsage, code, v)
		assert.Contains(t, errOut, "spec-tokens", v)
		assert.Contains(t, errOut, v, v)
	}
}
