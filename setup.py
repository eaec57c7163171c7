"""Builds the Cython putback kernel and installs the top-level `configs/` (settings, delivery profiles) as
`ditto_fast/configs/`; everything else is declared in pyproject.toml."""

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

setup(
    ext_modules=ext_modules,
    packages=[*find_packages(include=["ditto_fast*"]), "ditto_fast.configs"],
    package_dir={"ditto_fast.configs": "configs"},
    package_data={"ditto_fast": ["render/*.pyx"], "ditto_fast.configs": ["*.yaml", "delivery/*.yaml"]},
)
