package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// newFlagSet returns the flag set of the registered command name: errors
// go to stderr, and -h prints the command's usage line, help and flags.
func newFlagSet(name, help string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s\n%s", commands[name].usage, help)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlagsOnly parses args for a command that takes no positional
// arguments. When the command must stop, ok is false and code is its exit
// code: exitOK after -h, exitUsage after a bad flag or a positional argument.
func parseFlagsOnly(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pagedkv %s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return exitUsage, false
	}
	return 0, true
}
