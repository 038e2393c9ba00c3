"""Builds libfanin (the Go SDK as a C library) into the package: pip install runs `go build`.

The repository's Go module is two folders up; Go 1.26 must be on PATH (or in GO). Set
FANIN_LIB_PREBUILT to a libfanin.so built elsewhere to skip the build.
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


class BuildWithGo(build_py):
    def run(self):
        super().run()
        out = (Path(self.build_lib) / "fanin" / "libfanin.so").resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        prebuilt = os.environ.get("FANIN_LIB_PREBUILT")
        if prebuilt:
            shutil.copyfile(prebuilt, out)
            return
        if not (ROOT / "go.mod").exists():
            raise SystemExit(f"fanin: building libfanin needs the fanin repository around {HERE}")
        go = os.environ.get("GO") or shutil.which("go")
        if not go:
            raise SystemExit("fanin: building libfanin needs Go (https://go.dev/dl/) on PATH, or GO=/path/to/go")
        cmd = [go, "build", "-trimpath", "-buildmode=c-shared", "-o", str(out), "./sdk/libfanin"]
        print("fanin:", " ".join(cmd))
        subprocess.run(cmd, cwd=ROOT, check=True)
        out.with_suffix(".h").unlink(missing_ok=True)


setup(cmdclass={"build_py": BuildWithGo})
