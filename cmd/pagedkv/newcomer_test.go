package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A bad flag, on any command, prints the error (prefixed with the command)
// and one line pointing to -h: the error stays on the screen instead of
// scrolling off above every flag's help.
func TestFlagErrorsPointToHelp(t *testing.T) {
	for name := range commands {
		if name == "version" {
			continue // takes no flags at all (TestVerifyUsage's neighbours check its error)
		}
		for _, tc := range []struct {
			args  []string
			first string
		}{
			{[]string{"--no-such-flag"}, "pagedkv " + name + ": flag provided but not defined: -no-such-flag"},
			{[]string{"---x"}, "pagedkv " + name + ": bad flag syntax: ---x"},
		} {
			code, out, errOut := runCLI(append([]string{name}, tc.args...)...)
			assert.Equal(t, exitUsage, code, "%s %v", name, tc.args)
			assert.Empty(t, out, "%s %v", name, tc.args)
			assert.Equal(t, []string{tc.first, "run 'pagedkv " + name + " -h' for its usage and flags"}, lines(errOut),
				"%s %v", name, tc.args)
		}
	}
	code, _, errOut := runCLI("simulate", "--pages", "x")
	assert.Equal(t, exitUsage, code)
	assert.Equal(t, []string{`pagedkv simulate: invalid value "x" for flag -pages: parse error`,
		"run 'pagedkv simulate -h' for its usage and flags"}, lines(errOut))
	code, _, errOut = runCLI("simulate", "extra")
	assert.Equal(t, exitUsage, code)
	assert.Equal(t, []string{`pagedkv simulate: unexpected arguments ["extra"]`,
		"run 'pagedkv simulate -h' for its usage and flags"}, lines(errOut))
	// -h itself still prints the whole help, to stdout through help NAME.
	code, out, _ := runCLI("help", "simulate")
	assert.Equal(t, exitOK, code)
	assert.True(t, strings.HasPrefix(out, "usage: pagedkv simulate "), out)
	assert.Contains(t, out, "  -pages int")
}

// A configuration that can never run is bad usage (exit 2, naming the
// value), not a run whose verification failed (exit 1): before, simulate
// --pages 1 printed a summary ending in "verification: FAILED" and exited 1.
func TestImpossibleConfigurationsExitTwo(t *testing.T) {
	const tooSmall = "sim: bad config: request 0 can never run: its 152 tokens (prompt 125 + output 28 - 1) need at least 10 pages of 16 tokens, and the pool has "
	for _, tc := range []struct {
		args  []string
		first string
	}{
		{[]string{"--pages", "1"}, "pagedkv simulate: " + tooSmall + "1"},
		{[]string{"--pages", "9"}, "pagedkv simulate: " + tooSmall + "9"},
		{[]string{"--pages", "8", "--replicas", "2"}, "pagedkv simulate: prefix-aware routing: " + tooSmall + "8"},
		{[]string{"--pages", "0"}, "pagedkv simulate: sim: bad config: pagedkv: bad config: allocator: bad config: NumPages = 0, want 1..16777216"},
		{[]string{"--pages", "-3"}, "pagedkv simulate: sim: bad config: pagedkv: bad config: allocator: bad config: NumPages = -3, want 1..16777216"},
	} {
		code, out, errOut := runCLI(append([]string{"simulate", "--quiet"}, tc.args...)...)
		assert.Equal(t, exitUsage, code, "%v\nstdout:\n%s", tc.args, out)
		assert.Empty(t, out, "%v", tc.args)
		assert.Equal(t, tc.first, lines(errOut)[0], "%v", tc.args)
	}
}

// README's set-up section has exactly its two commands, and every pagedkv
// command README.md shows works as typed from the repository root: as `go
// run ./cmd/pagedkv ...` (nothing installs a pagedkv binary unless README
// says go install). Each names a registered command whose flags parse;
// those that are quick run whole (simulate's own run is
// TestSimulateDefault, and CI's main job).
func TestREADMECommandsWorkAsTyped(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	text := string(readme)

	setup := strings.SplitN(strings.SplitN(text, "## Set up", 2)[1], "\n## ", 2)[0]
	block := shellBlock.FindStringSubmatch(setup)
	require.NotNil(t, block, "README's Set up has no sh block")
	assert.Equal(t, []string{"go run ./cmd/pagedkv simulate", "go test -race ./..."}, commandsOf(block[1]))

	// A bare pagedkv command, inline or on a line of a shell block, needs
	// README to say how the binary gets installed.
	installs := strings.Contains(text, "go install ./cmd/pagedkv")
	bare := regexp.MustCompile("`pagedkv [a-z]+[^`]*`").FindAllString(text, -1)
	for _, b := range shellBlock.FindAllStringSubmatch(text, -1) {
		for _, c := range commandsOf(b[1]) {
			if strings.HasPrefix(c, "pagedkv ") {
				bare = append(bare, c)
			}
		}
	}
	for _, c := range bare {
		assert.True(t, installs, "README shows %s, but nothing installs a pagedkv binary", c)
	}

	t.Chdir("../..")
	var ran []string
	for _, m := range regexp.MustCompile("go run (-tags [a-z]+ )?\\./cmd/pagedkv([^`\n#]*)").FindAllStringSubmatch(text, -1) {
		args := strings.Fields(m[2])
		require.NotEmpty(t, args, "README breaks %q across lines, or gives no command", m[0])
		if args[0] != "help" {
			require.Contains(t, commands, args[0], "README runs %q", m[0])
		}
		switch {
		case m[1] != "" || args[0] == "simulate": // a build tag, or a long run: the flags parse
			code, _, errOut := runCLI(append(slices.Clone(args), "-h")...)
			assert.Equal(t, exitOK, code, "%s -h: %s", m[0], errOut)
		default:
			code, out, errOut := runCLI(args...)
			assert.Equal(t, exitOK, code, "%s\nstdout:\n%s\nstderr:\n%s", m[0], out, errOut)
			ran = append(ran, strings.Join(args, " "))
		}
	}
	assert.Contains(t, ran, "verify testdata/golden")
	assert.Contains(t, ran, "help")
}

// shellBlock matches a fenced sh block of Markdown; group 1 is its text.
var shellBlock = regexp.MustCompile("(?s)```sh\n(.*?)```")

// commandsOf returns the commands of a shell block, comments dropped.
func commandsOf(block string) []string {
	var cmds []string
	for _, line := range strings.Split(block, "\n") {
		if line, _, _ = strings.Cut(line, "#"); strings.TrimSpace(line) != "" {
			cmds = append(cmds, strings.TrimSpace(line))
		}
	}
	return cmds
}
