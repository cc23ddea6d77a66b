"""cuda_library: CUDA sources compiled by the toolkit's nvcc into a cc_library.

Bazel 4 has no CUDA rules; a genrule runs nvcc on each .cu file (position-independent, for the
GPUs listed in CUDA_ARCHS, with PTX of the newest for later GPUs) and the objects become the srcs
of a cc_library that also carries the headers and links the CUDA runtime. The .cu files include
no LibTorch headers: they take raw pointers and a stream, and a C++ wrapper built by the ordinary
toolchain turns tensors into those.
"""

load("@rules_cc//cc:defs.bzl", "cc_library")

# H100 / H200 (sm_90); PTX of compute_90 is compiled by the driver for newer GPUs.
CUDA_ARCHS = ["90"]

COMMON_FLAGS = [
    "-O3",
    "-std=c++17",
    "-Xcompiler=-fPIC",
    "--expt-relaxed-constexpr",
]
PTX_FLAGS = ["-gencode=arch=compute_%s,code=compute_%s" % (CUDA_ARCHS[-1], CUDA_ARCHS[-1])]

def _nvcc_flags(arch_suffix):
    """Code for sm_90 (or sm_90a with arch_suffix "a") and compute_90's PTX."""
    return COMMON_FLAGS + [
        "-gencode=arch=compute_%s%s,code=sm_%s%s" % (a, arch_suffix, a, arch_suffix)
        for a in CUDA_ARCHS
    ] + PTX_FLAGS

NVCC_FLAGS = _nvcc_flags("")

# For the sources listed in a cuda_library's `arch_specific_srcs`: code for sm_90a, with the
# Hopper-only instructions (wgmma) that GateUpSiluMma in trainer/kernels/linear_kernels.cu needs
# (it runs on sm_90 devices only; the kernel checks for one), and the same PTX of compute_90,
# without them. Their front end then runs twice (decode_kernels.cu took 73 s so against 50), so
# only the sources that need it take these flags.
ARCH_SPECIFIC_NVCC_FLAGS = _nvcc_flags("a")

def cuda_library(name, srcs, hdrs = [], deps = [], arch_specific_srcs = [], nvcc_hdrs = [],
                 **kwargs):
    """`nvcc_hdrs`: headers of other packages (exported there) that the .cu files include."""
    objects = []
    for src in srcs:
        flags = ARCH_SPECIFIC_NVCC_FLAGS if src in arch_specific_srcs else NVCC_FLAGS
        obj = "%s_%s.o" % (name, src.replace("/", "_").replace(".cu", ""))
        native.genrule(
            name = obj.replace(".o", "_nvcc"),
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            tools = ["@cuda//:nvcc"],
            cmd = "$(location @cuda//:nvcc) %s -I. -c $(location %s) -o $@" % (
                " ".join(flags),
                src,
            ),
        )
        objects.append(obj)
    cc_library(
        name = name,
        srcs = objects,
        hdrs = [h for h in hdrs if not h.endswith(".cuh")],  # .cuh: device code for nvcc only
        deps = deps + ["@cuda//:cudart"],
        **kwargs
    )
