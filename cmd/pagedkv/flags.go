package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// newFlagSet returns the flag set of the registered command name. -h
// prints the command's usage line, help and flags. A bad flag prints the
// flag package's error, prefixed with "pagedkv NAME: ", and one line
// pointing to -h, so that the error is the last thing on the screen, not
// followed by every flag (TestFlagErrorsPointToHelp).
//
// The flag package calls Usage both for -h and after printing a parse
// error through Output; flagErrorOutput tells the two apart by whether the
// error was just written.
func newFlagSet(name, help string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	out := &flagErrorOutput{w: stderr, prefix: "pagedkv " + name + ": "}
	fs.SetOutput(out)
	fs.Usage = func() {
		if out.wroteError {
			out.wroteError = false
			fmt.Fprintf(stderr, "run 'pagedkv %s -h' for its usage and flags\n", name)
			return
		}
		fmt.Fprintf(stderr, "usage: %s\n%s", commands[name].usage, help)
		fs.SetOutput(stderr) // PrintDefaults writes through Output: not an error
		fs.PrintDefaults()
		fs.SetOutput(out)
	}
	return fs
}

// flagErrorOutput is a flag set's Output: everything the flag package
// writes there, outside Usage, is a parse error, which it prefixes with
// the command's name and records.
type flagErrorOutput struct {
	w          io.Writer
	prefix     string
	wroteError bool
}

func (o *flagErrorOutput) Write(p []byte) (int, error) {
	if !o.wroteError {
		o.wroteError = true
		if _, err := io.WriteString(o.w, o.prefix); err != nil {
			return 0, err
		}
	}
	return o.w.Write(p)
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
		fmt.Fprintf(stderr, "run 'pagedkv %s -h' for its usage and flags\n", fs.Name())
		return exitUsage, false
	}
	return 0, true
}
