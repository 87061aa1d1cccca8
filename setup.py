"""The one compiled part: the codec's CPU kernels (host_agent/codec/_native.c: peeling, set bits).

Everything else is in pyproject.toml. The extension is optional: where no C compiler is present the
install still succeeds and the codec uses its torch implementations, which are slower on a CPU.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "host_agent.codec._native",
            ["host_agent/codec/_native.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        )
    ]
)
