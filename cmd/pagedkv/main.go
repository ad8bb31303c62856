// Command pagedkv is the project's command-line tool. Each subcommand lives
// in its own file and registers itself from that file's init function:
//
//	func init() {
//		register(&command{
//			name:    "verify",
//			summary: "check backends against FlashInfer reference cases",
//			usage:   "pagedkv verify [--backend cpu|emu|cuda] [--fallback cpu] [-v] DIR|FILE...",
//			run:     runVerify,
//		})
//	}
//
// main.go only dispatches: `pagedkv NAME ARGS...` calls the run function of
// the command called NAME with ARGS and exits with the code it returns
// (0 success, 1 the command ran and found a failure, 2 bad usage).
//
// # Invariants
//
//   - Every command is registered complete (name, summary, usage, run) and
//     once; a duplicate or incomplete one panics at init, which any test
//     run catches.
//   - A command writes only to the stdout and stderr it is given and
//     returns its exit code, so tests run every command in-process.
//   - Every pagedkv command README.md shows works as typed from the
//     repository root (newcomer_test.go).
//
// # Concurrency
//
// main runs one command; the commands state their own goroutines
// (simulate's replicas, replay's fleet).
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// Exit codes shared by every subcommand.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and something failed (a case, a check)
	exitUsage   = 2 // bad arguments
)

// command is one subcommand.
type command struct {
	name    string
	summary string // one line, for the command list
	usage   string // the synopsis, starting with "pagedkv NAME"
	// run executes the command with the arguments after its name and
	// returns the exit code. It writes only to stdout and stderr, so tests
	// can run it in-process.
	run func(args []string, stdout, stderr io.Writer) int
}

// commands holds every registered subcommand by name.
var commands = map[string]*command{}

// register adds c to the command table. It panics on a duplicate or
// incomplete command (a programming error caught by any test run).
func register(c *command) {
	if c.name == "" || c.run == nil || c.summary == "" || c.usage == "" {
		panic(fmt.Sprintf("pagedkv: incomplete command %+v", c))
	}
	if _, dup := commands[c.name]; dup {
		panic("pagedkv: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches args (without the program name) and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			c, ok := commands[args[1]]
			if !ok {
				fmt.Fprintf(stderr, "pagedkv: unknown command %q\n", args[1])
				usage(stderr)
				return exitUsage
			}
			// Each command prints its own flags for -h.
			return c.run([]string{"-h"}, stdout, stdout)
		}
		usage(stdout)
		return exitOK
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "pagedkv: unknown command %q\n", name)
		usage(stderr)
		return exitUsage
	}
	return c.run(args[1:], stdout, stderr)
}

// usage lists the commands.
func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	width := 0
	for n := range commands {
		names = append(names, n)
		width = max(width, len(n))
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: pagedkv COMMAND [ARGS]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, n, commands[n].summary)
	}
	b.WriteString("\nRun 'pagedkv help COMMAND' for a command's flags.\n")
	io.WriteString(w, b.String())
}
