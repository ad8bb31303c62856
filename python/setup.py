"""Builds libpagedkv.so into the package (pyproject.toml has the metadata).

build_py runs scripts/libpagedkv.sh (stripped: PAGEDKV_STRIP=1) of the Go
module this folder sits in, or of the copy of its source an sdist carries
in gosrc/, writing the library next to the package's modules in the build
tree, so that both pip install and pip wheel bundle it. It needs go and
gcc; where either is missing it stops at once, saying so and naming the
prebuilt wheel instead. $GO names the go command (default go), $CC the C
compiler (default gcc).

The wheel is tagged py3-none-<platform>: the package calls the library
through ctypes, so it has no CPython ABI; the platform is the manylinux
tag of the glibc symbol versions the library imports
(scripts/glibc-tag.sh, objdump -T). scripts/wheel.sh is the one command
that builds it.

The sdist carries the Go sources the library is built from (go list -deps
./cabi: the module's packages it imports, go.mod, go.sum) in gosrc/, so it
builds wherever go and gcc run (Go fetches the modules go.sum names, or
finds them in its module cache).
"""

import json
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
GOSRC = "gosrc"  # the Go sources' folder in an sdist
SCRIPTS = ("scripts/libpagedkv.sh", "scripts/glibc-tag.sh")


def source_root():
    """The Go module the library is built from: the tree python/ sits in,
    else the sdist's gosrc/; None when neither holds cabi/pagedkv.h."""
    for root in (os.path.dirname(HERE), os.path.join(HERE, GOSRC)):
        if all(os.path.exists(os.path.join(root, p)) for p in ("go.mod", "cabi/pagedkv.h") + SCRIPTS):
            return root
    return None


NO_TOOLS = ("pagedkv: building libpagedkv.so from source needs %s on PATH, not found. Install the prebuilt wheel "
            "instead (no compiler needed): `pip install pagedkv-<version>-py3-none-manylinux_*.whl`, built on a "
            "machine with go and gcc by `bash scripts/wheel.sh` (docs/python.md, \"Installing\")")


def check_tools():
    missing = [t for t in (os.environ.get("GO") or "go", os.environ.get("CC") or "gcc") if not shutil.which(t)]
    if missing:
        raise SystemExit(NO_TOOLS % " and ".join(missing))


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        root = source_root()
        if root is None:
            raise SystemExit("pagedkv: no Go source to build libpagedkv.so from: neither %s nor %s holds go.mod, "
                             "cabi/pagedkv.h and %s (build from a pagedkv source tree or its sdist)"
                             % (os.path.dirname(HERE), os.path.join(HERE, GOSRC), ", ".join(SCRIPTS)))
        check_tools()
        out = os.path.join(os.path.abspath(self.build_lib), "pagedkv", "libpagedkv.so")
        self.announce("building %s with %s" % (out, os.path.join(root, SCRIPTS[0])), level=2)
        try:
            subprocess.run(["bash", os.path.join(root, SCRIPTS[0]), out], check=True,
                           env=dict(os.environ, PAGEDKV_STRIP="1"))
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit("pagedkv: building libpagedkv.so failed (%s); it needs go and gcc on PATH, "
                             "or $GO naming the go command" % e)


class SdistWithGoSource(sdist):
    """An sdist that carries the Go sources libpagedkv is built from."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = os.path.dirname(HERE)
        go = os.environ.get("GO") or "go"
        if not shutil.which(go):
            raise SystemExit(NO_TOOLS % go)
        out = subprocess.run([go, "list", "-deps", "-json", "./cabi"], cwd=root, check=True,
                             stdout=subprocess.PIPE).stdout.decode()
        names = ["go.mod", "go.sum"] + list(SCRIPTS)
        dec, i = json.JSONDecoder(), 0
        while i < len(out):
            pkg, i = dec.raw_decode(out, i)
            while i < len(out) and out[i].isspace():
                i += 1
            d = pkg.get("Dir", "")
            if pkg.get("Standard") or not (d == root or d.startswith(root + os.sep)) or "Module" not in pkg:
                continue
            if pkg["Module"].get("Path") != "github.com/pagedkv/pagedkv":
                continue
            rel = os.path.relpath(d, root)
            for key in ("GoFiles", "CgoFiles", "CFiles", "HFiles", "SFiles", "EmbedFiles"):
                names += [os.path.join(rel, f) for f in pkg.get(key) or ()]
        for name in names:
            dst = os.path.join(base_dir, GOSRC, name)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.join(root, name), dst)


def platform_tag(lib):
    """The manylinux tag of lib (scripts/glibc-tag.sh)."""
    root = source_root()
    out = subprocess.run(["bash", os.path.join(root, SCRIPTS[1]), lib], check=True, stdout=subprocess.PIPE)
    return out.stdout.decode().strip()


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # it bundles a shared library: a platform wheel, not py3-none-any


cmdclass = {"build_py": BuildWithLibrary, "sdist": SdistWithGoSource}
try:
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """py3-none-<manylinux tag of the library>: no CPython ABI (ctypes)."""

        def get_tag(self):
            build_lib = self.get_finalized_command("build_py").build_lib
            return "py3", "none", platform_tag(os.path.join(build_lib, "pagedkv", "libpagedkv.so"))

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # no wheel package: pip install of the prebuilt wheel needs none
    pass

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
