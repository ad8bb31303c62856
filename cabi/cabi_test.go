package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestCAndPython builds libpagedkv and runs its C test program and the
// Python package's pytest suite (scripts/cabi.sh), so that go test ./...
// covers the C ABI and the binding. It skips only when a tool is missing,
// and fails instead under CI=true (.ci/run installs python3-numpy and
// python3-pytest).
func TestCAndPython(t *testing.T) {
	missing := func(what string) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s, and CI=true: the C ABI and Python tests must run in CI", what)
		}
		t.Skipf("%s: skipping the C ABI and Python tests (scripts/cabi.sh)", what)
	}
	for _, tool := range []string{"gcc", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing(tool + " not found")
		}
	}
	const python = "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import numpy, pytest").CombinedOutput(); err != nil {
		missing(python + " with numpy and pytest not found (apt-get install python3-numpy python3-pytest): " + string(out))
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join(root, "scripts", "cabi.sh"), t.TempDir())
	cmd.Env = append(os.Environ(), "PYTHON="+python)
	out, err := cmd.CombinedOutput()
	t.Logf("scripts/cabi.sh:\n%s", out)
	if err != nil {
		t.Fatalf("scripts/cabi.sh: %v", err)
	}
}
