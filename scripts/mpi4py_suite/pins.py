"""The one mpi4py release the suite runs, and the sha256 of its files on PyPI.

Both hashes were checked with `pip download --require-hashes` against PyPI
(which refuses a file whose hash differs from the one given).
"""

VERSION = "4.1.2"

# The source distribution: its test/ directory is the suite; CI builds the
# module from it (with mpicc) for the machine's Open MPI.
SDIST = "mpi4py-4.1.2.tar.gz"
SDIST_SHA256 = "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02"

# PyPI's wheel for CPython 3.12 on x86-64 Linux, for a machine whose Python
# has no mpi4py 4.1.2 and cannot build one. It holds two builds of the
# module, MPI.openmpi.*.so linked against libmpi.so.40 (Open MPI 4.x and 5.x)
# and MPI.mpich.*.so against libmpi.so.12; mpi4py/_mpiabi.py picks the one
# whose library loads, so the machine's own Open MPI is used.
WHEEL_CP312 = "mpi4py-4.1.2-cp312-cp312-manylinux1_x86_64.manylinux_2_5_x86_64.whl"
WHEEL_CP312_SHA256 = "00f4cce8999d19f35243c3442ea22debbe3336f69c309cd5d3176df4e51c717a"

FILES = {SDIST: SDIST_SHA256, WHEEL_CP312: WHEEL_CP312_SHA256}
