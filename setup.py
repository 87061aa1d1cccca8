"""The compiled parts: the codec's CPU kernels (host_agent/codec/_native.c and the *_kernels.c it binds:
peeling, sketch encoding, the nonzero scan, set bits; pthreads for the second core) and the
batched UDP I/O that the worker's channel and softswitch's UDP ports share (lhc_ina/_udp.c: sendmmsg,
recvmmsg).

Everything else is in pyproject.toml. Both extensions are optional: where no C compiler is present the
install still succeeds; the codec then uses its torch implementations and UDP one system call per datagram,
both slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "host_agent.codec._native",
            [
                "host_agent/codec/_native.c",
                "host_agent/codec/peel_kernels.c",
                "host_agent/codec/scan_kernels.c",
                "host_agent/codec/sketch_kernels.c",
            ],
            depends=["host_agent/codec/kernels.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
        Extension(
            "lhc_ina._udp",
            ["lhc_ina/_udp.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            optional=True,
        ),
    ]
)
