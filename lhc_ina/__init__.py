"""lhc-ina: in-network aggregation with lossless homomorphic compression (shared core).

This package holds what every part agrees on: the protocol constants (``constants``), the P4 include
generated from them (``p4gen``), and the packet layout (``wire``).
"""
