"""The C++ CPU kernels and the layers that keep a GGUF file's blocks: library.py builds and loads
row_kernel.cpp as torch ops; quantized.py packs block codes into `QuantizedLinear`. The network in model/ never
imports this package: the kept-block load (interop/) and the compiled decode step (generation/) do."""
