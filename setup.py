"""The compiled parts: the codec's CPU kernels (host_agent/codec/_native.c: peeling, set bits), the
batched UDP I/O that the worker's channel and softswitch's UDP ports share (lhc_ina/_udp.c: sendmmsg,
recvmmsg) and softswitch's native data plane (softswitch/_dataplane*.c).

Everything else is in pyproject.toml. Every extension is optional: where no C compiler is present the
install still succeeds; the codec then uses its torch implementations, UDP one system call per datagram
and softswitch its Python pipeline, all slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "host_agent.codec._native",
            ["host_agent/codec/_native.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        ),
        Extension(
            "lhc_ina._udp",
            ["lhc_ina/_udp.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            optional=True,
        ),
        Extension(
            "softswitch._dataplane",
            [
                "softswitch/_dataplane.c", "softswitch/_dataplane_pipeline.c", "softswitch/_dataplane_io.c",
                "softswitch/_dataplane_gso.c", "softswitch/_dataplane_tables.c",
            ],
            depends=["softswitch/_dataplane.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            optional=True,
        ),
    ]
)
