"""Repository rules that find the locally installed dependencies (tools/setup.sh installs them).

Nothing is downloaded: each rule asks the installed tool where its files are and symlinks them
into an external repository with a BUILD file of our own.
"""

def _run_or_fail(ctx, argv, what):
    result = ctx.execute(argv)
    if result.return_code != 0:
        fail("cannot locate %s (%s): %s\nRun tools/setup.sh first." %
             (what, " ".join(argv), result.stderr))
    return result.stdout.strip()

def _torch_repository_impl(ctx):
    python = ctx.which("python3")
    if python == None:
        fail("python3 not found on PATH; run tools/setup.sh")

    # find_spec does not import torch (importing it takes seconds and needs numpy).
    root = _run_or_fail(ctx, [python, "-c", "import importlib.util as u; " +
                                            "s = u.find_spec('torch'); " +
                                            "print(s.submodule_search_locations[0] if s else '')"], "torch")
    if not root:
        fail("the Python package torch is not installed; run tools/setup.sh")
    version = ctx.read(root + "/version.py")
    if "2.11.0" not in version:
        fail("torch at %s is not 2.11.0 (see its version.py); run tools/setup.sh" % root)

    # The CUDA runtime libraries libtorch_cuda.so needs come from the nvidia-* wheels beside it.
    site = root.rpartition("/")[0]
    # Torch bundles fmt 12 headers under include/fmt; Debian's spdlog 1.10 needs its fmt 9, and
    # both would be found as <fmt/...>. Only c10/util/strong_type.h (unused here) includes fmt,
    # so the bundled copy is left out and <fmt/...> means /usr/include/fmt everywhere.
    for entry in ctx.path(root + "/include").readdir():
        if entry.basename != "fmt":
            ctx.symlink(entry, "include/" + entry.basename)
    ctx.symlink(root + "/lib", "lib")
    ctx.file("paths.bzl", "TORCH_LIB_DIR = %r\nNVIDIA_DIR = %r\n" % (root + "/lib", site + "/nvidia"))
    ctx.template("BUILD", ctx.attr._build_file, substitutions = {
        "%{TORCH_LIB_DIR}": root + "/lib",
    })

torch_repository = repository_rule(
    implementation = _torch_repository_impl,
    attrs = {"_build_file": attr.label(default = "//third_party:torch.BUILD.tpl")},
    environ = ["PATH"],
    local = True,
)

def _cuda_repository_impl(ctx):
    cuda_home = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if not ctx.path(cuda_home + "/include/cuda_runtime.h").exists:
        fail("CUDA toolkit not found at %s (set CUDA_HOME); run tools/setup.sh" % cuda_home)
    if not ctx.path(cuda_home + "/include/nccl.h").exists:
        fail("nccl.h not found under %s/include; run tools/setup.sh" % cuda_home)
    ctx.symlink(cuda_home + "/include", "include")
    ctx.symlink(cuda_home + "/lib64", "lib64")
    if not ctx.path(cuda_home + "/bin/nvcc").exists:
        fail("nvcc not found at %s/bin (set CUDA_HOME); run tools/setup.sh" % cuda_home)
    # nvcc finds its own tools relative to its real path, so it is called there, not through a
    # symlink in this repository.
    ctx.file("nvcc", "#!/bin/sh\nexec %s/bin/nvcc \"$@\"\n" % cuda_home, executable = True)

    # Debian's CUDA 13 packages put NCCL under lib/, not lib64/.
    nccl_dir = cuda_home + "/lib" if ctx.path(cuda_home + "/lib/libnccl.so").exists else cuda_home + "/lib64"
    ctx.template("BUILD", ctx.attr._build_file, substitutions = {
        "%{CUDA_HOME}": cuda_home,
        "%{NCCL_LIB_DIR}": nccl_dir,
    })

cuda_repository = repository_rule(
    implementation = _cuda_repository_impl,
    attrs = {"_build_file": attr.label(default = "//third_party:cuda.BUILD.tpl")},
    environ = ["CUDA_HOME"],
    local = True,
)

def _mpi_repository_impl(ctx):
    mpicc = ctx.which("mpicc")
    if mpicc == None:
        fail("mpicc not found on PATH; run tools/setup.sh (Open MPI)")
    incdirs = _run_or_fail(ctx, [mpicc, "--showme:incdirs"], "MPI headers").split(" ")
    libdirs = _run_or_fail(ctx, [mpicc, "--showme:libdirs"], "MPI libraries").split(" ")
    ctx.symlink(incdirs[0], "include")
    ctx.template("BUILD", ctx.attr._build_file, substitutions = {
        "%{LIBDIR}": libdirs[0],
    })

mpi_repository = repository_rule(
    implementation = _mpi_repository_impl,
    attrs = {"_build_file": attr.label(default = "//third_party:mpi.BUILD.tpl")},
    environ = ["PATH"],
    local = True,
)
