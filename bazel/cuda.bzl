"""CUDA for Bazel 4.2.3 without rules_cuda: nvcc in a genrule, wrapped by a cc_library.

CUDA targets exist in every build but are *compatible* only under --config=cuda
(--define=optstep_cuda=1, the //:cuda config_setting): in the default build, wildcard patterns
such as //... skip them without running nvcc, and naming one explicitly fails with
"target platform didn't satisfy constraint //kernels/cuda:requires_config_cuda". Code that must
build in both configurations depends on CUDA targets only through a select() on //:cuda (see
//kernels:device_factory).

    load("//bazel:cuda.bzl", "cuda_only", "optstep_cuda_library")

    optstep_cuda_library(
        name = "elementwise_kernels",
        srcs = ["elementwise_kernels.cu"],
        hdrs = ["elementwise_kernels.h"],
        deps = ["//kernels/math:elementwise"],
    )

    cc_test(name = "foo_gpu_test", ..., target_compatible_with = cuda_only())
"""

_NVCC = "/usr/local/cuda/bin/nvcc"

# sm_90 SASS (H100/H200) plus compute_90 PTX that the driver can JIT for newer GPUs.
_NVCC_FLAGS = [
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
    "-O3",
    "-std=c++17",
    "--compiler-options -fPIC",
    "-Xcudafe --display_error_number",
]

def cuda_only():
    """target_compatible_with value for targets that need --config=cuda."""
    return select({
        "//:cuda": [],
        "//conditions:default": ["//kernels/cuda:requires_config_cuda"],
    })

def if_cuda(if_true, if_false = []):
    """`if_true` under --config=cuda, else `if_false`.

    Use it for every @cuda//... dependency, even of targets that are cuda_only(): Bazel 4 still
    resolves the dependencies of an incompatible target, and the default build must work where
    /usr/local/cuda does not exist.
    """
    return select({
        "//:cuda": if_true,
        "//conditions:default": if_false,
    })

def _workspace_headers_impl(ctx):
    # The headers of `deps` (transitively) that belong to this workspace: the inputs nvcc may
    # #include besides the CUDA toolkit and the system headers, which it finds by itself.
    headers = depset(transitive = [
        dep[CcInfo].compilation_context.headers
        for dep in ctx.attr.deps
        if CcInfo in dep
    ])
    return [DefaultInfo(files = depset([
        h
        for h in headers.to_list()
        if h.owner == None or h.owner.workspace_name == ""
    ]))]

_workspace_headers = rule(
    implementation = _workspace_headers_impl,
    attrs = {"deps": attr.label_list()},
)

def optstep_cuda_library(name, srcs, hdrs = [], deps = [], nvcc_flags = [], visibility = None):
    """Compiles `srcs` (.cu) with nvcc into a static archive wrapped by cc_library `name`.

    Args:
      name: the cc_library; its archive is lib<name>_nvcc.a.
      srcs: .cu files. They may include `hdrs`, the headers of `deps` (workspace-relative
        paths) and CUDA headers.
      hdrs: headers that host code includes (plain launcher declarations, no kernels).
      deps: cc_library targets whose headers the .cu files or `hdrs` include.
      nvcc_flags: extra nvcc flags for this library.
      visibility: of the cc_library.
    """
    _workspace_headers(
        name = name + "_dep_hdrs",
        deps = deps,
        target_compatible_with = cuda_only(),
        visibility = ["//visibility:private"],
    )
    archive = "lib%s_nvcc.a" % name
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs + [":" + name + "_dep_hdrs"],
        outs = [archive],
        cmd = " ".join([
            _NVCC,
            "-lib",
            "-o $@",
        ] + _NVCC_FLAGS + nvcc_flags + [
            "-I.",
            "-I$(GENDIR)",
            "-I$(BINDIR)",
        ] + ["$(location %s)" % s for s in srcs]),
        message = "nvcc " + " ".join(srcs),
        target_compatible_with = cuda_only(),
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + archive],
        hdrs = hdrs,
        alwayslink = True,
        linkstatic = True,
        deps = deps + if_cuda(["@cuda//:cudart"]),
        target_compatible_with = cuda_only(),
        visibility = visibility,
    )
