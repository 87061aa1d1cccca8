"""The compiled parts: the codec's CPU kernels (host_agent/codec/_native.c and the *_kernels.c it binds:
peeling, sketch encoding, the nonzero scan, set bits; pthreads for the second core), the worker's packet
engine (host_agent/transport/_engine.c: window, timers, loss recovery, reassembly and the socket work, per
batch), softswitch's native data plane (softswitch/_dataplane*.c) and the batched UDP I/O that the worker's
channel and softswitch's UDP ports share (lhc_ina/_udp.c: sendmmsg, recvmmsg), all three over one layer
(lhc_ina/udp_batch.c).

Everything else is in pyproject.toml. Every extension is optional: where no C compiler is present the
install still succeeds; the codec then uses its torch implementations, the stream its Python engine,
softswitch its Python pipeline and UDP one system call per datagram, all slower.
"""

from setuptools import Extension, setup

#: The one batched-UDP layer (GSO runs, bursts, the socket-error rule), compiled into every extension
#: that moves datagrams.
UDP_BATCH, UDP_BATCH_H = "lhc_ina/udp_batch.c", "lhc_ina/udp_batch.h"

setup(
    ext_modules=[
        Extension(
            "host_agent.codec._native",
            [
                "host_agent/codec/_native.c",
                "host_agent/codec/bloom_kernels.c",
                "host_agent/codec/hash_kernels.c",
                "host_agent/codec/peel_kernels.c",
                "host_agent/codec/scan_kernels.c",
                "host_agent/codec/sketch_kernels.c",
                "host_agent/codec/sort_kernels.c",
            ],
            depends=["host_agent/codec/kernels.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
        Extension(
            "host_agent.transport._engine",
            ["host_agent/transport/_engine.c", "host_agent/transport/engine_core.c",
             "host_agent/transport/engine_io.c", UDP_BATCH],
            depends=["host_agent/transport/engine_core.h", "host_agent/transport/engine.h", UDP_BATCH_H],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            optional=True,
        ),
        Extension(
            "lhc_ina._udp",
            ["lhc_ina/_udp.c", "lhc_ina/udp_planner.c", UDP_BATCH],
            depends=[UDP_BATCH_H],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            optional=True,
        ),
        Extension(
            "softswitch._dataplane",
            [
                "softswitch/_dataplane.c", "softswitch/_dataplane_pipeline.c", "softswitch/_dataplane_io.c",
                "softswitch/_dataplane_tables.c", "softswitch/_dataplane_slots.c", UDP_BATCH,
            ],
            depends=["softswitch/_dataplane.h", UDP_BATCH_H],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            optional=True,
        ),
    ]
)
