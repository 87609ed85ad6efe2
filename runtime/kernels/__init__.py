"""Expert kernels at run time: loading generated CPU (ctypes) and Triton kernels, and their references."""
