// Package pythontest runs Debian's Python (/usr/bin/python3) with its
// packages as a peer in tests: the libzmq and msgpack peers of the KV-event
// interoperability tests. A test that needs a module it cannot import is
// skipped, or fails under CI=true, where .ci/run installs the packages.
//
// # Invariants
//
//   - Only Debian's interpreter runs ([Python], /usr/bin/python3), whatever
//     python3 is first on PATH, so the peer's modules are the Debian
//     packages .ci/run installs.
//   - A missing module never passes silently: [Require] skips, naming the
//     Debian package to install, or fails under CI=true.
//   - A started process never outlives its test: it is killed when the
//     test ends, and its standard error is logged if the test failed.
//
// # Concurrency
//
// Its functions are called from a test's goroutine; a started process
// belongs to its test.
package pythontest

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Python is Debian's interpreter, whose packages .ci/run installs.
const Python = "/usr/bin/python3"

// Require skips t, or fails it under CI=true, unless Python can import
// every module named.
func Require(t testing.TB, modules ...string) {
	t.Helper()
	err := exec.Command(Python, "-c", "import "+strings.Join(modules, ", ")).Run()
	if err == nil {
		return
	}
	what := Python + " cannot import " + strings.Join(modules, ", ") + " (apt-get install " + debianPackages(modules) + ")"
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s, and CI=true: %v", what, err)
	}
	t.Skipf("%s: %v", what, err)
}

func debianPackages(modules []string) string {
	p := make([]string, len(modules))
	for i, m := range modules {
		p[i] = "python3-" + m
	}
	return strings.Join(p, " ")
}

// Process is a running script.
type Process struct {
	// Lines are its standard output's lines, closed when it exits.
	Lines <-chan string
	// Stdin is its standard input; closing it tells the scripts here to
	// finish.
	Stdin io.WriteCloser
}

// Start runs script with args. When t ends the process is killed and, if
// t failed, its standard error is logged.
func Start(t testing.TB, script string, args ...string) *Process {
	t.Helper()
	cmd := exec.Command(Python, append([]string{script}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("%s %s stderr:\n%s", script, strings.Join(args, " "), stderr.String())
		}
	})
	return &Process{Lines: lines, Stdin: in}
}
