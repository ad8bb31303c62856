package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/pagedkv/pagedkv/internal/golden"
)

func init() {
	register(&command{
		name:    "verify",
		summary: "run FlashInfer reference cases on a backend and report how close it came",
		usage:   "pagedkv verify [--backend NAME] [--fallback NAME] [-v] DIR|FILE...",
		run:     runVerify,
	})
}

const verifyHelp = `
Runs every *.safetensors reference case (format pagedkv-golden/1, see
docs/golden.md) found under the given directories, prints one line per case
and a last line "verify: N passed, M failed". The exit code is 1 when a case
fails or a file cannot be read, 2 on bad usage.

A path that is not a regular file once symlinks are followed (a device
such as /dev/zero, a FIFO) or is larger than 1 GiB fails as such, before
anything is read; a file that is not safetensors is named so.

An operation the backend does not implement fails as "unsupported on NAME"
unless --fallback names a backend to rerun it on; the line then says
"(NAME fallback)". Host-side operations (get_seq_lens, packbits, masks, ...)
do not use a backend.

Flags (they may come before or after the paths):
`

func runVerify(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("verify", verifyHelp, stderr)
	backendName := fs.String("backend", "cpu", "backend to verify: "+strings.Join(backendNames(), ", "))
	fallbackName := fs.String("fallback", "", "backend that reruns cases the --backend does not support (e.g. cpu)")
	verbose := fs.Bool("v", false, "also print one line per output of each case")
	paths, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage
	}
	if len(paths) == 0 {
		fmt.Fprintln(stderr, "pagedkv verify: no directory or file given")
		fs.Usage()
		return exitUsage
	}
	r := &golden.Runner{}
	if r.Backend, err = openBackend(*backendName); err != nil {
		fmt.Fprintf(stderr, "pagedkv verify: %v\n", err)
		return usageOr(err, exitFailure)
	}
	if *fallbackName != "" {
		if *fallbackName == *backendName {
			fmt.Fprintf(stderr, "pagedkv verify: --fallback %s is the --backend itself\n", *fallbackName)
			return exitUsage
		}
		if r.Fallback, err = openBackend(*fallbackName); err != nil {
			fmt.Fprintf(stderr, "pagedkv verify: --fallback: %v\n", err)
			return usageOr(err, exitFailure)
		}
	}
	files, err := golden.Find(paths...)
	if err != nil {
		fmt.Fprintf(stderr, "pagedkv verify: %v\n", err)
		fmt.Fprintln(stdout, "verify: 0 passed, 1 failed")
		return exitFailure
	}
	passed, failed := 0, 0
	for _, f := range files {
		res := r.RunFile(f)
		fmt.Fprintln(stdout, res.String())
		if *verbose {
			for _, line := range res.Details() {
				fmt.Fprintln(stdout, line)
			}
		}
		if res.Passed() {
			passed++
		} else {
			failed++
		}
	}
	fmt.Fprintf(stdout, "verify: %d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return exitFailure
	}
	return exitOK
}

// usageOr returns exitUsage for an unknown backend name, else code.
func usageOr(err error, code int) int {
	var unknown errUnknownBackend
	if errors.As(err, &unknown) {
		return exitUsage
	}
	return code
}

// parseInterspersed parses flags that may appear before, between or after
// positional arguments (flag.Parse stops at the first positional one) and
// returns the positional arguments in order. "--" ends flag parsing.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag.Parse consumed a "--" terminator if it saw one: everything
		// left is positional.
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
