"""What `make demo` runs: the training demo (``train``, one ``worker`` per rank) and the codec check."""
