"""The compiled parts, named one way: an extension ``pkg/_name.c`` (the module: its Python types and their
argument parsing) and its C parts beside it as ``name_<part>.c`` with ``name.h`` / ``name_<part>.h``:

- ``host_agent/transport/_engine.c`` + ``engine_core.c`` (window, timers, loss recovery, reassembly; the
  twin of ``engine_core.py``) + ``engine_io.c`` (the socket work per batch): the worker's packet engine;
- ``softswitch/_dataplane.c`` + ``dataplane_pipeline.c``, ``dataplane_io.c``, ``dataplane_tables.c``,
  ``dataplane_slots.c``: softswitch's native data plane;
- ``lhc_ina/_udp.c`` + ``udp_receive.c`` (``udp.h``) + ``udp_batch.c`` (the one batched-UDP layer,
  sendmmsg with GSO runs and recvmmsg, and the one socket-error rule, that the other two use as well;
  ``udp_python.h``: its counters as Python objects);
- ``host_agent/codec/cpu/_kernels.c`` (and ``_kernels_quantize.c``, its quantize bindings) +
  ``kernels_peel.c``, ``kernels_sketch.c``, ``kernels_scan.c``, ``kernels_hash.c``, ``kernels_quantize.c``,
  ``kernels_sort.c``, ``kernels_bloom.c``, ``kernels_threads.c`` (``kernels.h``): the codec's CPU kernels
  (pthreads for the second core), loaded by ``host_agent/codec/cpu/__init__.py``.

Everything else is in pyproject.toml. Every extension is optional: where no C compiler is present the
install still succeeds; the codec then uses its torch implementations, the stream its Python engine,
softswitch its Python pipeline and UDP one system call per datagram, all slower.
"""

from setuptools import Extension, setup

#: The one batched-UDP layer (GSO runs, bursts, the socket-error rule), compiled into every extension
#: that moves datagrams.
UDP_BATCH, UDP_BATCH_H = "lhc_ina/udp_batch.c", "lhc_ina/udp_batch.h"
#: Its counters as Python objects (header-only), for the extensions that expose them.
UDP_PYTHON_H = "lhc_ina/udp_python.h"

setup(
    ext_modules=[
        Extension(
            "host_agent.codec.cpu._kernels",
            [
                "host_agent/codec/cpu/_kernels.c",
                "host_agent/codec/cpu/_kernels_pack.c",
                "host_agent/codec/cpu/_kernels_quantize.c",
                "host_agent/codec/cpu/kernels_bloom.c",
                "host_agent/codec/cpu/kernels_hash.c",
                "host_agent/codec/cpu/kernels_pack.c",
                "host_agent/codec/cpu/kernels_peel.c",
                "host_agent/codec/cpu/kernels_quantize.c",
                "host_agent/codec/cpu/kernels_scan.c",
                "host_agent/codec/cpu/kernels_sketch.c",
                "host_agent/codec/cpu/kernels_sort.c",
                "host_agent/codec/cpu/kernels_threads.c",
            ],
            depends=["host_agent/codec/cpu/kernels.h"],
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
            ["lhc_ina/_udp.c", "lhc_ina/udp_receive.c", UDP_BATCH],
            depends=["lhc_ina/udp.h", UDP_BATCH_H, UDP_PYTHON_H],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            optional=True,
        ),
        Extension(
            "softswitch._dataplane",
            [
                "softswitch/_dataplane.c", "softswitch/dataplane_pipeline.c", "softswitch/dataplane_io.c",
                "softswitch/dataplane_tables.c", "softswitch/dataplane_slots.c", UDP_BATCH,
            ],
            depends=["softswitch/dataplane.h", UDP_BATCH_H, UDP_PYTHON_H],
            extra_compile_args=["-O3", "-std=c11", "-Wall"],
            optional=True,
        ),
    ]
)
