"""Getting the pinned mpi4py: its files (fetched once into the carry folder,
sha256-checked on every use), the suite's test/ directory, and an mpi4py
module of the pinned version importable by the Python that runs the ranks.

Where the module comes from, first match wins:
  1. the interpreter's own installed mpi4py, if it is the pinned version
     (the GPU machine's environment);
  2. a private copy built earlier for this interpreter and this MPI (the
     user cache, ~/.cache/gpucoll-mpi4py-suite);
  3. the carried wheel, when its Python tag is the interpreter's (cp312),
     unpacked into the private copy;
  4. a build from the sdist with `pip wheel` (mpicc from PATH; pip fetches
     the build requirements, Cython and setuptools, from PyPI), unpacked
     into the private copy.
A private copy is put first on the ranks' PYTHONPATH; nothing is installed
into any interpreter.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from . import pins


class ProvisionError(Exception):
    pass


def log(msg):
    print(f"mpi4py-suite: {msg}", flush=True)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verified(carry, name):
    """The path of a pinned file in the carry folder, if there and intact."""
    path = os.path.join(carry, name)
    if not os.path.exists(path):
        return None
    got = sha256(path)
    if got != pins.FILES[name]:
        raise ProvisionError(f"{path}: sha256 {got}, pinned {pins.FILES[name]}: remove it and fetch again")
    return path


def pip_download(python, carry, name, binary):
    """Download one pinned file with pip, which checks the pinned hash."""
    os.makedirs(carry, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        req = os.path.join(tmp, "req.txt")
        with open(req, "w") as f:
            f.write(f"mpi4py=={pins.VERSION} --hash=sha256:{pins.FILES[name]}\n")
        cmd = [python, "-m", "pip", "download", "--no-deps", "--require-hashes", "-r", req, "-d", tmp,
               "--disable-pip-version-check"]
        if binary:
            cmd += ["--only-binary", ":all:", "--python-version", "3.12", "--implementation", "cp",
                    "--abi", "cp312", "--platform", "manylinux_2_5_x86_64"]
        else:
            # Only mpi4py as source: pip prepares its metadata, and its build
            # requirements (Cython, setuptools) should come as wheels.
            cmd += ["--no-binary", "mpi4py"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = os.path.join(tmp, name)
        if done.returncode != 0 or not os.path.exists(got):
            raise ProvisionError(f"pip download of {name} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        shutil.move(got, os.path.join(carry, name))
    return verified(carry, name)


def fetch(python, carry):
    """Put every pinned file into the carry folder (for a machine without PyPI)."""
    for name in pins.FILES:
        if verified(carry, name):
            log(f"{name}: present, sha256 ok")
            continue
        log(f"{name}: downloading")
        pip_download(python, carry, name, binary=name.endswith(".whl"))
        log(f"{name}: sha256 ok")


def sdist(python, carry):
    path = verified(carry, pins.SDIST)
    if path:
        return path
    log(f"{pins.SDIST} not in {carry}: downloading")
    return pip_download(python, carry, pins.SDIST, binary=False)


def unpack_tests(sdist_path, dest):
    """A fresh copy of the sdist's test/ directory in dest/test."""
    top = f"mpi4py-{pins.VERSION}/test/"
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    with tarfile.open(sdist_path) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(top) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = "test/" + m.name[len(top):]
            if os.path.isabs(m.name) or ".." in m.name.split("/"):
                raise ProvisionError(f"unsafe path in {sdist_path}: {m.name}")
            tar.extract(m, dest)
    return os.path.join(dest, "test")


def probe(python, pythonpath=None):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    code = ("import json, sys, mpi4py; print(json.dumps({'version': mpi4py.__version__, "
            "'file': mpi4py.__file__, 'tag': 'cp%d%d' % sys.version_info[:2], 'exe': sys.executable}))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def python_tag(python):
    done = subprocess.run([python, "-c", "import sys; print('cp%d%d' % sys.version_info[:2], sys.executable)"],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def mpi_identity():
    """What a built module depends on: the MPI compiler wrapper's view."""
    parts = []
    for cmd in (["mpicc", "-showme"], ["mpirun", "--version"]):
        try:
            parts.append(subprocess.run(cmd, capture_output=True, text=True).stdout.strip())
        except OSError:
            parts.append("")
    return "\n".join(parts)


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpucoll-mpi4py-suite")


def unzip(wheel, dest):
    tmp = dest + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if os.path.isabs(name) or ".." in name.split("/"):
                raise ProvisionError(f"unsafe path in {wheel}: {name}")
        z.extractall(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)


def build(python, sdist_path, dest):
    log(f"building mpi4py {pins.VERSION} from {os.path.basename(sdist_path)} with mpicc for {python} (minutes)")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        env.setdefault("MPICC", shutil.which("mpicc") or "mpicc")
        cmd = [python, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", tmp, sdist_path]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if done.returncode != 0 or len(wheels) != 1:
            raise ProvisionError(f"building mpi4py failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        unzip(os.path.join(tmp, wheels[0]), dest)


def module(python, carry, allow_build=True):
    """(PYTHONPATH entry or None, description) giving `python` mpi4py VERSION."""
    installed = probe(python)
    if installed and installed["version"] == pins.VERSION:
        return None, f"mpi4py {pins.VERSION} installed ({os.path.dirname(installed['file'])})"
    tag, exe = python_tag(python)
    key = hashlib.sha256("\n".join([pins.SDIST_SHA256, os.path.realpath(exe), tag, mpi_identity()]).encode())
    dest = os.path.join(cache_dir(), f"mpi4py-{pins.VERSION}-{tag}-{key.hexdigest()[:16]}")
    found = probe(python, dest) if os.path.isdir(dest) else None
    if found and found["version"] == pins.VERSION and found["file"].startswith(dest):
        return dest, f"mpi4py {pins.VERSION} private copy ({dest})"
    wheel = verified(carry, pins.WHEEL_CP312) if tag == "cp312" else None
    if wheel:
        unzip(wheel, dest)
        how = f"mpi4py {pins.VERSION} from the carried wheel ({dest})"
    elif allow_build:
        build(python, sdist(python, carry), dest)
        how = f"mpi4py {pins.VERSION} built from the sdist ({dest})"
    else:
        raise ProvisionError(f"{python} has no mpi4py {pins.VERSION} and building is off")
    found = probe(python, dest)
    if not found or found["version"] != pins.VERSION:
        raise ProvisionError(f"{dest} does not give {python} mpi4py {pins.VERSION}")
    return dest, how


def describe_installed(python):
    got = probe(python)
    return "none" if got is None else f"{got['version']} ({got['file']})"


if __name__ == "__main__":
    sys.exit("not a program: scripts/mpi4py-suite uses this module")
