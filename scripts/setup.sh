#!/usr/bin/env bash
# Install what gpucoll needs to build and run on a fresh Debian/Ubuntu machine.
#
# Idempotent: packages already present are not reinstalled, and when `mpicc`,
# `mpirun`, libclang and the C toolchain are all there it installs nothing.
#
#   ./scripts/setup.sh            # as root, or as a user with sudo
#   ./scripts/setup.sh --no-cuda  # skip the pinned nvcc wheels (host-only build)
#
# What and why:
#   openmpi-bin libopenmpi-dev   mpirun and mpicc; mpi-sys's build script runs
#                                `mpicc -show` to find MPI's headers and libs
#   libclang-dev                 bindgen (inside mpi-sys) dlopens libclang and
#                                needs clang's own headers (stddef.h, ...)
#   pkg-config build-essential   the C compiler and linker the build uses
#   gfortran                     mpif90 for the MPI shim's Fortran test programs
#   python3-mpi4py python3-numpy the shim's mpi4py test (run with /usr/bin/python3,
#                                built against this Open MPI; a python3 earlier
#                                on PATH, e.g. pyenv's, does not see them)
#   python3-dev python3-pip      scripts/mpi4py-suite builds mpi4py 4.1.2 from its
#                                sdist (pip wheel, with mpicc) into a private
#                                folder of ~/.cache for /usr/bin/python3: Debian's
#                                python3-mpi4py (3.1) is too old for its test suite
#   cargo                        not installed here: see the message below
set -euo pipefail

log() { printf 'setup.sh: %s\n' "$*"; }
die() { printf 'setup.sh: error: %s\n' "$*" >&2; exit 1; }

# How to run a command as root: directly, through sudo, or not at all.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root to run '$*' (not root and no sudo); install these packages by hand: ${MISSING_PKGS[*]}"
    fi
}

have_libclang() {
    # libclang.so (or a versioned one) somewhere the loader or clang-sys finds it,
    # plus clang's resource headers (the -dev package brings them).
    if [ -n "${LIBCLANG_PATH:-}" ] && ls "$LIBCLANG_PATH"/libclang*.so* >/dev/null 2>&1; then
        return 0
    fi
    local found=""
    for d in /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib; do
        if ls "$d"/libclang.so* "$d"/libclang-[0-9]*.so* >/dev/null 2>&1; then
            found=yes
            break
        fi
    done
    [ -n "$found" ] || return 1
    # Resource headers (stddef.h) of some clang version.
    ls /usr/lib/llvm-*/lib/clang/*/include/stddef.h >/dev/null 2>&1 ||
        ls /usr/lib/clang/*/include/stddef.h >/dev/null 2>&1
}

MISSING_PKGS=()

check_system_packages() {
    command -v mpicc >/dev/null 2>&1 || MISSING_PKGS+=(libopenmpi-dev)
    command -v mpirun >/dev/null 2>&1 || MISSING_PKGS+=(openmpi-bin)
    have_libclang || MISSING_PKGS+=(libclang-dev)
    command -v pkg-config >/dev/null 2>&1 || MISSING_PKGS+=(pkg-config)
    { command -v cc >/dev/null 2>&1 && command -v make >/dev/null 2>&1; } || MISSING_PKGS+=(build-essential)
    # The MPI shim's tests (mpi_shim/tests): Fortran programs and mpi4py.
    command -v gfortran >/dev/null 2>&1 || MISSING_PKGS+=(gfortran)
    if ! /usr/bin/python3 -c 'import mpi4py.MPI' >/dev/null 2>&1; then
        MISSING_PKGS+=(python3-mpi4py)
    fi
    /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1 || MISSING_PKGS+=(python3-numpy)
    # scripts/mpi4py-suite: Python's headers and pip, to build mpi4py 4.1.2.
    /usr/bin/python3 -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
        >/dev/null 2>&1 || MISSING_PKGS+=(python3-dev)
    /usr/bin/python3 -m pip --version >/dev/null 2>&1 || MISSING_PKGS+=(python3-pip)
}

install_system_packages() {
    check_system_packages
    if [ "${#MISSING_PKGS[@]}" -eq 0 ]; then
        log "MPI (mpicc, mpirun), libclang, the C toolchain, gfortran, mpi4py and Python's headers and pip are present; nothing to install"
        return 0
    fi
    command -v apt-get >/dev/null 2>&1 ||
        die "missing ${MISSING_PKGS[*]} and this is not a Debian/Ubuntu system (no apt-get); install Open MPI (or MPICH) with mpicc, libclang and a C compiler by hand"
    log "installing: ${MISSING_PKGS[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${MISSING_PKGS[@]}"
    MISSING_PKGS=()
    check_system_packages
    [ "${#MISSING_PKGS[@]}" -eq 0 ] || die "still missing after apt-get: ${MISSING_PKGS[*]}"
}

check_rust() {
    if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
        log "cargo is in $HOME/.cargo/bin but not on PATH: run 'source \$HOME/.cargo/env' (or add it to PATH)"
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found. Install Rust (1.78 or newer) with rustup: https://rustup.rs (curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh), then 'source \$HOME/.cargo/env'"
    log "$(cargo --version)"
    # CI runs cargo fmt and cargo clippy.
    local comp missing=()
    for comp in rustfmt clippy; do
        cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1 || missing+=("$comp")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        if command -v rustup >/dev/null 2>&1; then
            log "adding rustup components: ${missing[*]}"
            rustup component add "${missing[@]}"
        else
            log "warning: cargo ${missing[*]} missing and no rustup to add them (only CI's lint step needs them)"
        fi
    fi
}

# CUDA toolchain for the `cuda` feature: nvcc, cicc, ptxas and the CUDA
# headers from pinned PyPI wheels, unpacked into ./.cuda (git-ignored), where
# build.rs finds nvcc by itself. Every package is pinned: nvcc's wheel names
# its dependencies unpinned and would otherwise pull a newer, mismatched CUDA.
# Output of nvcc 13.0 needs an NVIDIA driver >= 580 to run.
CUDA_WHEELS=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-crt==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-cccl==13.0.85
)

install_cuda_toolchain() {
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local nvcc="$root/.cuda/nvidia/cu13/bin/nvcc"
    if [ -x "$nvcc" ]; then
        log "CUDA toolchain present: $("$nvcc" --version | tail -n 1)"
        return 0
    fi
    local py
    py="$(command -v python3 || command -v python || true)"
    if [ -z "$py" ] || ! "$py" -m pip --version >/dev/null 2>&1; then
        command -v apt-get >/dev/null 2>&1 ||
            die "python3 has no pip and there is no apt-get to install it; install pip, or build without CUDA (--no-cuda, then cargo build --no-default-features)"
        log "installing python3-pip (to fetch the pinned nvcc wheels)"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3 python3-pip
        py="$(command -v python3)"
    fi
    log "installing the pinned CUDA 13.0 toolchain wheels into $root/.cuda"
    local pip=("$py" -m pip install --quiet --disable-pip-version-check --no-deps
        --target "$root/.cuda" "${CUDA_WHEELS[@]}")
    # A distribution's python may refuse installs outside a virtual
    # environment (PEP 668); --target writes only into ./.cuda, so say so.
    "${pip[@]}" 2>/dev/null || "${pip[@]}" --break-system-packages
    [ -x "$nvcc" ] || die "nvcc not found at $nvcc after installing the wheels"
    log "CUDA toolchain ready: $("$nvcc" --version | tail -n 1)"
}

usage() {
    cat <<USAGE
usage: scripts/setup.sh [--no-cuda]
  (no option)  install Open MPI, libclang, a C toolchain, gfortran,
               python3-mpi4py + python3-numpy (the shim tests) and python3-dev +
               python3-pip (scripts/mpi4py-suite) if missing, check
               cargo, and install nvcc 13.0 from pinned PyPI wheels into
               ./.cuda (the default build compiles the CUDA kernels)
  --no-cuda    skip nvcc; then build with `cargo build --no-default-features`
               (host backend only)
  --cuda       accepted for compatibility (the default)
USAGE
}

main() {
    local cuda=yes
    for arg in "$@"; do
        case "$arg" in
            --cuda) cuda=yes ;;
            --no-cuda) cuda=no ;;
            -h | --help) usage; exit 0 ;;
            *) usage >&2; die "unknown option: $arg" ;;
        esac
    done
    install_system_packages
    check_rust
    if [ "$cuda" = yes ]; then
        install_cuda_toolchain
    fi
    log "ok"
}

main "$@"
