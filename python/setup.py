"""Builds libflm with cargo and puts it inside the package, so that `pip install ./python`
(or the wheel of `pip wheel ./python`) gives an `import flm` that needs no FLM_LIBRARY.

The library is built from the Rust workspace this directory sits in (pip builds a local
directory in place since pip 21.3). FLM_CARGO_PROFILE picks cargo's profile (default
`release`; CI uses `dev` to reuse its debug build), CARGO_TARGET_DIR its target directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

WORKSPACE = Path(__file__).resolve().parent.parent
LIBRARY = "libflm.dylib" if sys.platform == "darwin" else "libflm.so"


def build_libflm() -> Path:
    """Runs cargo for the flm-capi crate and returns the path of the shared library."""
    if not (WORKSPACE / "tools" / "capi" / "Cargo.toml").is_file():
        sys.exit(
            f"flm: the Rust workspace is not at {WORKSPACE}; build the package from the "
            "repository (pip install ./python, with pip >= 21.3)"
        )
    cargo = shutil.which("cargo")
    if cargo is None:
        sys.exit("flm: building libflm needs cargo (a Rust toolchain >= 1.89, from rustup)")
    profile = os.environ.get("FLM_CARGO_PROFILE", "release")
    subprocess.run(
        [cargo, "build", "--profile", profile, "-p", "flm-capi", "--lib"],
        cwd=WORKSPACE,
        check=True,
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    # cargo writes the dev profile into `debug`; every other profile into its own name.
    return WORKSPACE / target / ("debug" if profile == "dev" else profile) / LIBRARY


class BuildWithLibrary(build_py):
    """build_py that also copies the freshly built libflm into the package."""

    def run(self) -> None:
        super().run()
        library = build_libflm()
        destination = Path(self.build_lib) / "flm" / LIBRARY
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, destination)


class NativeDistribution(Distribution):
    """A distribution that holds a native library, so its wheel is for one platform."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    """A wheel for this platform and any Python 3: the library is loaded with ctypes, so it
    does not depend on the interpreter's ABI."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    distclass=NativeDistribution,
    cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel},
)
