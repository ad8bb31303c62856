package main

import (
	"archive/zip"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// debianPython is the interpreter the Python tests use: Debian's, with its
// python3-numpy, python3-pytest, python3-setuptools, python3-wheel and
// python3-venv (the python3 on PATH may be another one, e.g. pyenv's).
const debianPython = "/usr/bin/python3"

// requireTools skips the test when a tool it needs is missing, and fails
// it instead under CI=true (.ci/run installs them all).
func requireTools(t *testing.T, tools []string, pythonModules string) {
	t.Helper()
	missing := func(what string) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s, and CI=true: the C ABI and Python tests must run in CI", what)
		}
		t.Skipf("%s: skipping (.ci/run installs it)", what)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing(tool + " not found")
		}
	}
	if pythonModules != "" {
		if out, err := exec.Command(debianPython, "-c", "import "+pythonModules).CombinedOutput(); err != nil {
			missing(debianPython + " cannot import " + pythonModules + ": " + string(out))
		}
	}
}

// run runs name in dir and fails the test, with the command's output, if
// it does not succeed; it returns the output.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("%s %s (%.1f s)", name, strings.Join(args, " "), time.Since(start).Seconds())
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// soname returns the DT_SONAME entries of the shared library at path.
func soname(t *testing.T, path string) []string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil {
		t.Fatalf("%s: reading DT_SONAME: %v", path, err)
	}
	return names
}

// TestLibraryHasSONAME builds libpagedkv.so the way every build of it does
// (scripts/libpagedkv.sh) and checks that it records the SONAME
// libpagedkv.so, read with debug/elf and, where binutils is installed, as
// readelf -d shows it.
func TestLibraryHasSONAME(t *testing.T) {
	requireTools(t, []string{"bash", "gcc"}, "")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(t.TempDir(), "libpagedkv.so")
	run(t, root, nil, "bash", filepath.Join(root, "scripts", "libpagedkv.sh"), lib)
	if got := soname(t, lib); len(got) != 1 || got[0] != "libpagedkv.so" {
		t.Fatalf("%s: SONAME %q, want [libpagedkv.so]", lib, got)
	}
	if _, err := exec.LookPath("readelf"); err == nil {
		out := run(t, root, nil, "readelf", "-d", lib)
		if !strings.Contains(out, "Library soname: [libpagedkv.so]") {
			t.Fatalf("readelf -d %s shows no SONAME libpagedkv.so:\n%s", lib, out)
		}
	}
}

// TestInstalledLibraryBuildsWithPkgConfig installs the C library under a
// fresh prefix (scripts/install-libpagedkv.sh), builds the C test program
// with nothing but `pkg-config --cflags --libs pagedkv`, runs it, and
// checks that the program records libpagedkv.so as NEEDED, the name the
// dynamic loader looks for (the SONAME; TestLibraryHasSONAME checks that).
func TestInstalledLibraryBuildsWithPkgConfig(t *testing.T) {
	requireTools(t, []string{"bash", "gcc", "pkg-config"}, "")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	prefix := t.TempDir()
	run(t, root, nil, "bash", filepath.Join(root, "scripts", "install-libpagedkv.sh"), prefix)
	pc := []string{"PKG_CONFIG_PATH=" + filepath.Join(prefix, "lib", "pkgconfig")}
	if got := strings.TrimSpace(run(t, root, pc, "pkg-config", "--modversion", "pagedkv")); got != "3" {
		t.Errorf("pkg-config --modversion pagedkv = %q, want the ABI version 3", got)
	}
	flags := strings.Fields(run(t, root, pc, "pkg-config", "--cflags", "--libs", "pagedkv"))
	prog := filepath.Join(t.TempDir(), "pagedkv_test")
	args := append([]string{"-std=c11", "-Wall", "-Werror", filepath.Join(root, "cabi", "testdata", "pagedkv_test.c"), "-o", prog}, flags...)
	run(t, root, nil, "gcc", args...)
	if out := run(t, root, nil, prog); !strings.Contains(out, "pagedkv_test: ok") {
		t.Errorf("%s printed no \"pagedkv_test: ok\":\n%s", prog, out)
	}
	f, err := elf.Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	needed, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(needed, "libpagedkv.so") {
		t.Errorf("%s needs %q, not libpagedkv.so", prog, needed)
	}
}

// TestPythonPackageInstallsInFreshVenv does what docs/python.md
// ("Installing") tells a newcomer, offline, in a fresh copy of this source
// tree (its tracked and untracked files, nothing ignored, so no build
// output): bash scripts/wheel.sh builds the one wheel (it checks its
// py3-none-manylinux tag against objdump -T of the stripped library
// inside), then, with neither go nor gcc on PATH, a venv over Debian's
// packages installs it, runs README.md's "From Python" example from
// outside the tree with the bundled library (its SONAME checked), runs the
// project's pytest suite unchanged against the installed package (no
// PAGEDKV_LIB: conftest.py finds no library in the tree and uses the
// installed one), and pip install ./python (the sdist's build) stops at
// once saying go and gcc are missing. One compile of libpagedkv; about a
// minute on a loaded 2-core machine.
func TestPythonPackageInstallsInFreshVenv(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: compiles libpagedkv in a fresh tree")
	}
	requireTools(t, []string{"bash", "gcc", "git", "objdump"}, "numpy, pytest, setuptools, wheel, venv")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	tree := filepath.Join(tmp, "pagedkv")
	copyTree(t, root, tree)

	offline := []string{"PIP_NO_INDEX=1", "PIP_FIND_LINKS=", "PAGEDKV_LIB=", "PYTHONDONTWRITEBYTECODE=1"}
	dist := filepath.Join(tmp, "dist")
	out := run(t, tree, offline, "bash", filepath.Join(tree, "scripts", "wheel.sh"), dist)
	found, err := filepath.Glob(filepath.Join(dist, "pagedkv-*-py3-none-manylinux_*_*.whl"))
	if err != nil || len(found) != 1 {
		t.Fatalf("scripts/wheel.sh wrote %v (%v), want one pagedkv-*-py3-none-manylinux_*.whl:\n%s", found, err, out)
	}
	whl := found[0]
	t.Logf("wheel: %s", strings.TrimSpace(out))
	zr, err := zip.OpenReader(whl)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	zr.Close()
	for _, want := range []string{"pagedkv/libpagedkv.so", "pagedkv/py.typed", "pagedkv/__init__.py"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s holds %q, no %s", whl, names, want)
		}
	}

	// From here on neither go nor gcc can be found: PATH is the venv's
	// bin alone (and the interpreter the venv was made from).
	venv := filepath.Join(tmp, "v")
	run(t, tmp, offline, debianPython, "-m", "venv", "--system-site-packages", venv)
	bare := append(offline, "PATH="+filepath.Join(venv, "bin"))
	py := filepath.Join(venv, "bin", "python")
	run(t, tmp, bare, py, "-c", `import shutil, sys
missing = [t for t in ("go", "gcc", "cc") if shutil.which(t)]
sys.exit("on PATH: %s" % missing if missing else 0)`)
	run(t, tmp, bare, py, "-m", "pip", "install", whl) // as README.md says: numpy comes from Debian

	// README.md's first Python example, from outside the tree, with
	// PAGEDKV_LIB unset: only the bundled library can be found.
	readme, err := os.ReadFile(filepath.Join(tree, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	example := pythonBlock(t, string(readme), "## From Python")
	got := run(t, tmp, bare, py, "-c", example+`
import pagedkv
print(pagedkv.__file__)
print(pagedkv._lib._name)`)
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) < 2 {
		t.Fatalf("README's example printed %q", got)
	}
	pkgDir := filepath.Dir(lines[len(lines)-2])
	if !strings.HasPrefix(pkgDir, venv+string(filepath.Separator)) {
		t.Errorf("pagedkv imported from %s, not from the venv %s", pkgDir, venv)
	}
	lib := lines[len(lines)-1]
	if want := filepath.Join(pkgDir, "libpagedkv.so"); lib != want {
		t.Errorf("pagedkv loaded %s, want the bundled %s", lib, want)
	}
	if got := soname(t, lib); len(got) != 1 || got[0] != "libpagedkv.so" {
		t.Errorf("%s: SONAME %q, want [libpagedkv.so]", lib, got)
	}

	// The project's tests, unchanged, against the installed package.
	out = run(t, tree, bare, py, "-m", "pytest", "-p", "no:cacheprovider", "python/tests")
	if !strings.Contains(out, "pagedkv under test: "+pkgDir) {
		t.Errorf("pytest did not test the installed package %s:\n%s", pkgDir, out)
	}

	// Building from source (what an sdist does) says what is missing.
	cmd := exec.Command(py, "-m", "pip", "install", "--no-build-isolation", "./python")
	cmd.Dir = tree
	cmd.Env = append(os.Environ(), bare...)
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "pagedkv: building libpagedkv.so from source needs go and gcc on PATH, not found") {
		t.Errorf("pip install ./python without go and gcc: %v, want the message naming them:\n%s", err, b)
	}
}

// pythonBlock is the first ```python block of markdown's section under
// heading (a whole line).
func pythonBlock(t *testing.T, markdown, heading string) string {
	t.Helper()
	_, section, ok := strings.Cut(markdown, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("no heading %q", heading)
	}
	_, code, ok := strings.Cut(section, "```python\n")
	if !ok {
		t.Fatalf("no python block under %q", heading)
	}
	code, _, _ = strings.Cut(code, "```")
	return code
}

// copyTree copies the files of root that git tracks or would track (not
// the ignored ones: no build output) to dst, keeping their modes: a fresh
// clone of the working tree, uncommitted changes included.
func copyTree(t *testing.T, root, dst string) {
	t.Helper()
	files := strings.Split(strings.TrimRight(run(t, root, nil, "git", "ls-files", "-z", "--cached", "--others",
		"--exclude-standard"), "\x00"), "\x00")
	for _, name := range files {
		src := filepath.Join(root, name)
		info, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the working tree, not yet in the index
		}
		if err != nil {
			t.Fatal(err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		copyFile(t, src, filepath.Join(dst, name), info.Mode().Perm())
	}
}

func copyFile(t *testing.T, src, dst string, perm os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
