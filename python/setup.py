"""Builds libpagedkv.so into the package (pyproject.toml has the metadata).

build_py runs scripts/libpagedkv.sh of the Go module this folder sits in,
writing the library next to the package's modules in the build tree, so
that both pip install and pip wheel bundle it; the distribution is marked
as binary so that the wheel is tagged for this platform. $GO names the go
command (default go).
"""

import os
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD_SCRIPT = os.path.join(ROOT, "scripts", "libpagedkv.sh")


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        if not os.path.exists(BUILD_SCRIPT) or not os.path.exists(os.path.join(ROOT, "cabi", "pagedkv.h")):
            raise SystemExit("pagedkv: %s not found: the package is built from a pagedkv source tree "
                             "(python/ inside the Go module), which compiles libpagedkv.so" % BUILD_SCRIPT)
        out = os.path.join(os.path.abspath(self.build_lib), "pagedkv", "libpagedkv.so")
        self.announce("building %s with %s" % (out, BUILD_SCRIPT), level=2)
        try:
            subprocess.run(["bash", BUILD_SCRIPT, out], check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit("pagedkv: building libpagedkv.so failed (%s); it needs go and gcc on PATH, "
                             "or $GO naming the go command" % e)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # it bundles a shared library: a platform wheel, not py3-none-any


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
