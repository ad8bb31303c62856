"""import pagedkv loads libpagedkv at once: a missing or unusable library
fails the import, with a message naming every path tried, not the first
Manager()."""

import os
import shutil
import subprocess
import sys

from conftest import PACKAGE_DIR


def import_error(tmp_path, lib=None):
    """The exit status and last stderr line of importing a copy of the
    package that sits outside any source tree (so nothing but lib can be
    found: no bundled library, no build/cabi)."""
    shutil.copytree(PACKAGE_DIR, str(tmp_path / "pagedkv"), ignore=shutil.ignore_patterns("libpagedkv.so", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PAGEDKV_LIB", "PYTHONPATH")}
    if lib is not None:
        env["PAGEDKV_LIB"] = lib
    p = subprocess.run([sys.executable, "-c", "import pagedkv"], cwd=str(tmp_path), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    return p.returncode, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""


def test_a_missing_library_fails_the_import(tmp_path):
    rc, last = import_error(tmp_path)
    bundled = str(tmp_path / "pagedkv" / "libpagedkv.so")
    source_tree = os.path.normpath(str(tmp_path / ".." / "build" / "cabi" / "libpagedkv.so"))
    assert rc == 1
    assert last == ("ImportError: pagedkv: libpagedkv.so not found (tried %s, %s); pip install ./python bundles it, "
                    "scripts/libpagedkv.sh builds it into build/cabi/, or set PAGEDKV_LIB to its path"
                    % (bundled, source_tree))


def test_a_missing_pagedkv_lib_fails_the_import(tmp_path):
    rc, last = import_error(tmp_path, lib="/nonexistent/libpagedkv.so")
    assert rc == 1
    assert last.startswith("ImportError: pagedkv: libpagedkv.so not found (tried /nonexistent/libpagedkv.so);")


def test_a_file_that_is_not_a_library_fails_the_import(tmp_path):
    junk = tmp_path / "libjunk.so"
    junk.write_text("not an ELF file\n")
    rc, last = import_error(tmp_path, lib=str(junk))
    assert rc == 1
    assert last.startswith("ImportError: pagedkv: %s is not a loadable libpagedkv: " % junk), last
