"""mpi_test: a Catch2 test binary run on several ranks under mpirun (tests/mpi_run.sh)."""

load("@rules_cc//cc:defs.bzl", "cc_binary")

def mpi_test(name, srcs, deps = [], np = 2, args = [], data = [], size = "small", tags = [], **kwargs):
    cc_binary(
        name = name + "_bin",
        srcs = srcs,
        deps = deps + ["//tests:mpi_catch_main"],
        testonly = True,
    )
    native.sh_test(
        name = name,
        srcs = ["//tests:mpi_run.sh"],
        args = [str(np), "$(location :%s_bin)" % name] + args,
        data = [":%s_bin" % name] + data,
        size = size,
        tags = ["mpi"] + tags,
        **kwargs
    )
