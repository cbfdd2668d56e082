"""What each --mode runs: arrays, the shim, and what the ranks change in the suite.

numpy-plain   the suite's host arrays (array, NumPy and their DLPack and
              fake-__cuda_array_interface__ forms), plain Open MPI
numpy-shim    the same with the shim preloaded in host test mode
              (GPUCOLL_SHIM_HOST=1: host buffers go through gpucoll's host
              backend and the shim's staging paths)
cupy          CuPy arrays (device memory), shim preloaded
dlpack-cupy   CuPy arrays handed over through DLPack, shim preloaded
Device modes join with '+' (cupy+dlpack-cupy: both backends, one job per file).
In device modes the ranks lift the suite's Open MPI GPU skips and its
"no spawn tests once CuPy is loaded" rule (see rank_main.py).
"""


class Mode:
    def __init__(self, name, shim, host, device, backends):
        self.name = name
        self.shim = shim
        self.host = host
        self.device = device
        self.backends = backends


BASE = {
    "numpy-plain": Mode("numpy-plain", shim=False, host=False, device=False, backends=[]),
    "numpy-shim": Mode("numpy-shim", shim=True, host=True, device=False, backends=[]),
    "cupy": Mode("cupy", shim=True, host=False, device=True, backends=["cupy"]),
    "dlpack-cupy": Mode("dlpack-cupy", shim=True, host=False, device=True, backends=["dlpack-cupy"]),
}


def parse(text):
    parts = text.split("+")
    unknown = [p for p in parts if p not in BASE]
    if unknown:
        raise ValueError(f"unknown mode {'+'.join(unknown)} (modes: {', '.join(BASE)}; device modes join with +)")
    if len(parts) == 1:
        return BASE[parts[0]]
    if not all(BASE[p].device for p in parts):
        raise ValueError("only device modes (cupy, dlpack-cupy) join with +")
    backends = [b for p in parts for b in BASE[p].backends]
    return Mode(text, shim=True, host=False, device=True, backends=backends)


def rank_args(mode):
    if not mode.device:
        return []
    return ["--cupy", "--backends", ",".join(mode.backends), "--lift-gpu-skips", "--lift-spawn-skip"]


def environment(mode, base_env, shim_path, pythonpath):
    """The jobs' environment and the variables mpirun must pass to the ranks."""
    # The mode alone says whether the shim is there and in host mode.
    env = {k: v for k, v in base_env.items()
           if k not in ("LD_PRELOAD", "PYTHONPATH", "GPUCOLL_SHIM", "GPUCOLL_SHIM_HOST")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if mode.shim:
        env["LD_PRELOAD"] = shim_path
    if mode.host:
        env["GPUCOLL_SHIM_HOST"] = "1"
    # A collective gpucoll cannot finish ends in its own error, well before
    # the job's limit, so that it is reported as the failing test.
    env.setdefault("GPUCOLL_TIMEOUT", "60")
    exported = sorted(k for k in env if k in ("PYTHONPATH", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES")
                      or k.startswith(("GPUCOLL_", "CUDA_MPS_", "NCCL_", "MPI4PY_")))
    return env, exported
