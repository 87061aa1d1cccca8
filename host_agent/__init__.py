"""The worker side of lhc-ina: the codec, the transports and the PyTorch binding."""
