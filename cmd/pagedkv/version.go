package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is the release version, set at link time with
// -ldflags "-X main.version=v1.2.3"; otherwise the module version from the
// build info ("(devel)" in a source checkout) is printed.
var version = ""

func init() {
	register(&command{
		name:    "version",
		summary: "print the version, VCS revision and Go version",
		usage:   "pagedkv version",
		run:     runVersion,
	})
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			fmt.Fprintf(stdout, "usage: %s\n", commands["version"].usage)
			return exitOK
		}
		fmt.Fprintf(stderr, "pagedkv version: takes no arguments, got %q\n", args)
		return exitUsage
	}
	fmt.Fprintln(stdout, versionString(debug.ReadBuildInfo))
	return exitOK
}

// versionString formats "pagedkv VERSION [REVISION[-dirty]] GOVERSION OS/ARCH
// backends: ...", listing only the backends built into this binary (not
// cuda without -tags cuda, not emu without cgo). readBuildInfo is debug.ReadBuildInfo (a parameter so tests
// can supply build info).
func versionString(readBuildInfo func() (*debug.BuildInfo, bool)) string {
	v, rev, dirty := version, "", false
	if info, ok := readBuildInfo(); ok {
		if v == "" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(unknown)"
	}
	s := "pagedkv " + v
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "-dirty"
		}
		s += " " + rev
	}
	return fmt.Sprintf("%s %s %s/%s backends: %v", s, runtime.Version(), runtime.GOOS, runtime.GOARCH, builtBackendNames())
}
