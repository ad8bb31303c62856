package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestCAndPython builds libpagedkv and runs its C test program and the
// Python package's pytest suite (scripts/cabi.sh), so that go test ./...
// covers the C ABI and the binding. Without -short the pytest suite runs
// once, in TestPythonPackageInstallsInFreshVenv against the installed
// wheel (the same tests, every one of them, on the same code: running them
// here too would only repeat them); with -short, which skips that test, it
// runs here against the library just built. It skips only when a tool is
// missing, and fails instead under CI=true (.ci/run installs python3-numpy
// and python3-pytest).
func TestCAndPython(t *testing.T) {
	requireTools(t, []string{"gcc", "bash"}, "numpy, pytest")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join(root, "scripts", "cabi.sh"), t.TempDir())
	cmd.Env = append(os.Environ(), "PYTHON="+debianPython)
	if !testing.Short() {
		cmd.Env = append(cmd.Env, "PAGEDKV_PYTEST=0")
	}
	out, err := cmd.CombinedOutput()
	t.Logf("scripts/cabi.sh:\n%s", out)
	if err != nil {
		t.Fatalf("scripts/cabi.sh: %v", err)
	}
}
