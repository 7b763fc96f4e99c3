"""optim_test: an optimizer test on the CPU and, tagged gpu, on CUDA device 0.

    optim_test(name = "muon_test", srcs = ["muon_test.cc"], deps = [...])

defines `muon_test` (CPU) and `muon_test_gpu`: the same sources with OPTSTEP_TEST_DEVICE=cuda,
tagged "gpu" and built only under --config=cuda (see //bazel:cuda.bzl). The test helpers read
the variable (optim_test_util.h); without a GPU the gpu variant fails, never skips.
"""

load("//bazel:cuda.bzl", "cuda_only")

def optim_test(name, srcs, deps, size = "small"):
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs,
        deps = deps,
    )
    native.cc_test(
        name = name + "_gpu",
        size = size,
        srcs = srcs,
        deps = deps,
        env = {"OPTSTEP_TEST_DEVICE": "cuda"},
        tags = ["gpu"],
        target_compatible_with = cuda_only(),
    )
