"""The compiled parts: the codec's CPU kernels (host_agent/codec/_native.c: peeling, set bits) and the
worker channel's batched UDP I/O (host_agent/transport/_udp.c: sendmmsg, recvmmsg).

Everything else is in pyproject.toml. Both extensions are optional: where no C compiler is present the
install still succeeds; the codec then uses its torch implementations and the channel one system call per
datagram, both slower.
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
            "host_agent.transport._udp",
            ["host_agent/transport/_udp.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            optional=True,
        ),
    ]
)
