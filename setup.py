"""Builds the Cython putback kernel and declares the packages: `ditto_fast` and its subpackages, found from the
checkout's top level, and the top-level `configs/` (settings, delivery profiles), reached as `ditto_fast/configs/`
through the link of that name, installed as package data; everything else is declared in pyproject.toml."""

from pathlib import Path

from setuptools import find_packages, setup

ext_modules = []
pyx = Path(__file__).parent / "ditto_fast" / "render" / "_blend.pyx"
if pyx.exists():
    from Cython.Build import cythonize
    from setuptools import Extension

    ext_modules = cythonize(
        [Extension("ditto_fast.render._blend", [str(pyx.relative_to(Path(__file__).parent))],
                   extra_compile_args=["-O3"])],   # typed memoryviews only: no numpy headers, any numpy
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
        quiet=True,
    )

# configs/ and configs/delivery/ hold only YAML, yet Python can import any directory: each is declared a package of
# its own (setuptools warns about a data directory that is importable but not declared). They sit where their names
# say (ditto_fast/configs is a link to ../configs) and every package is found from the top level ("" = "."): an
# editable install is then a plain path entry, without setuptools' "Editable installation" warning box, which any
# package_dir mapping of its own brings
CONFIG_PACKAGES = ("ditto_fast.configs", "ditto_fast.configs.delivery")
# the newsroom page's files (serve's GET /): a data directory declared a package too, for the same reason
PAGE_PACKAGE = "ditto_fast.serve.page.static"

setup(
    ext_modules=ext_modules,
    packages=[*find_packages(include=["ditto_fast*"]), *CONFIG_PACKAGES, PAGE_PACKAGE],
    package_dir={"": "."},
    package_data={"ditto_fast": ["render/*.pyx"], **{name: ["*.yaml"] for name in CONFIG_PACKAGES},
                  PAGE_PACKAGE: ["*.html", "*.css", "*.js"]},
)
