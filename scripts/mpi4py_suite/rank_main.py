"""One rank of one test file of mpi4py's test suite, as scripts/mpi4py-suite
starts it under mpirun:

    python3 -B rank_main.py --testdir T --record D [--cupy] [--backends a,b]
        [--lift-gpu-skips] [--lift-spawn-skip] -- test_xxx

It runs the suite's own test program (T/main.py, so its options, skips and
banner are mpi4py's) with three changes the harness owns, made in this
process only, never in the installed mpi4py nor in the unpacked test files:

* the array backends the loops of arrayimpl.py visit are narrowed to
  --backends (CuPy, DLPack-CuPy: the device phases);
* --lift-gpu-skips: the suite's "Open MPI is not CUDA-aware" skips
  (mpiunittest.is_mpi_gpu("openmpi", array)) no longer skip, because the
  shim is what makes device buffers work on that Open MPI;
* --lift-spawn-skip: the suite skips its spawn tests whenever CuPy is
  imported (mpitestutil.disable_mpi_spawn); they use no arrays, so the
  device phases run the same spawn tests as the NumPy phase;

and one fix of the suite's helper for CuPy 14 (not a shim matter): CuPy
refuses ndarray.fill() with a value outside an integer dtype's range (-1 on
unsigned arrays, which the tests use to poison output buffers), where the
NumPy backend converts the value with astype, wrapping it (-1 -> 0xff..).
The CuPy backend gets the value wrapped the same way.

Each rank writes D/rank<R>.jsonl (one JSON object a line, flushed at once,
so a crash loses nothing written before it) and its verbose unittest output,
stdout and stderr (faulthandler's traceback on a fatal signal included) to
D/rank<R>.log. Events: start (pid), tests (the ids loaded), begin/end of each
test (outcome pass|fail|error|skip, detail), error (an error outside a test:
setUpClass, module import) and done. The process exits 0 after the suite ran
whatever its outcome, so that mpirun never tears down a peer still running
its last test; the harness reads outcomes from the records.
"""
import argparse
import faulthandler
import json
import os
import sys
import time
import traceback
import unittest


def rank_in_world():
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class Records:
    """The rank's event file: one JSON object a line, flushed line by line."""

    def __init__(self, path):
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process

    def write(self, event, **fields):
        fields["ev"] = event
        fields["t"] = round(time.time(), 3)
        self.file.write(json.dumps(fields) + "\n")
        self.file.flush()


RECORDS = None


def short(err, limit=2000):
    """The last lines of a formatted exception, bounded."""
    text = "".join(traceback.format_exception(*err))
    return text[-limit:]


def owner(test):
    """The test a subtest or skip belongs to."""
    return getattr(test, "test_case", test)


class RecordingResult(unittest.TextTestResult):
    """unittest's verbose text result that also records each test's outcome."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._state = {}

    def _mark(self, test, outcome, detail=""):
        state = self._state.setdefault(owner(test).id(), {"outcome": "pass", "detail": ""})
        rank_of = {"pass": 0, "skip": 1, "fail": 2, "error": 3}
        if rank_of[outcome] > rank_of[state["outcome"]]:
            state["outcome"] = outcome
            state["detail"] = detail

    def startTest(self, test):
        self._state[test.id()] = {"outcome": "pass", "detail": ""}
        RECORDS.write("begin", id=test.id())
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        state = self._state.pop(test.id(), {"outcome": "pass", "detail": ""})
        RECORDS.write("end", id=test.id(), outcome=state["outcome"], detail=state["detail"])

    def addError(self, test, err):
        super().addError(test, err)
        if isinstance(test, unittest.TestCase):
            self._mark(test, "error", short(err))
        else:
            # setUpClass/setUpModule and the like: no test is running.
            RECORDS.write("error", id=str(test), detail=short(err))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._mark(test, "fail", short(err))

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self._mark(test, "fail" if failed else "error", f"{subtest.id()}\n{short(err)}")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        # A skipped subtest leaves its test running; only a whole test skips.
        if owner(test) is test:
            self._mark(test, "skip", str(reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._mark(test, "fail", "unexpected success")


def test_ids(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from test_ids(item)
        else:
            yield item.id()


def narrow_backends(wanted):
    import arrayimpl

    have = [cls.backend for cls in arrayimpl.ArrayBackends]
    arrayimpl.ArrayBackends[:] = [cls for cls in arrayimpl.ArrayBackends if cls.backend in wanted]
    missing = set(wanted) - {cls.backend for cls in arrayimpl.ArrayBackends}
    if missing:
        raise SystemExit(f"rank_main: array backends {sorted(missing)} not available (have {have})")


def lift_gpu_skips():
    import mpiunittest

    suite_is_mpi_gpu = mpiunittest.is_mpi_gpu

    def is_mpi_gpu(predicate, array):
        if predicate.startswith("openmpi"):
            return False
        return suite_is_mpi_gpu(predicate, array)

    mpiunittest.is_mpi_gpu = is_mpi_gpu


def lift_spawn_skip():
    import mpitestutil

    suite_disable = mpitestutil.disable_mpi_spawn

    def disable_mpi_spawn():
        # The suite's own rules, judged as if no GPU array module were loaded.
        hidden = {name: sys.modules.pop(name) for name in ("cupy", "numba") if name in sys.modules}
        try:
            return suite_disable()
        finally:
            sys.modules.update(hidden)

    mpitestutil.disable_mpi_spawn = disable_mpi_spawn


def wrap_cupy_fill():
    import arrayimpl

    cls = getattr(arrayimpl, "GPUArrayCuPy", None)
    if cls is None:
        return
    import numpy

    suite_init = cls.__init__

    def init(self, arg, typecode, shape=None, readonly=False):
        if isinstance(arg, int) and not isinstance(arg, bool):
            dtype = numpy.dtype(typecode)
            if dtype.kind in "iu":
                info = numpy.iinfo(dtype)
                if not info.min <= arg <= info.max:
                    arg = numpy.asarray(arg).astype(dtype).item()
        suite_init(self, arg, typecode, shape, readonly)

    cls.__init__ = init


def use_local_gpu():
    """Each rank on GPU local_rank % count (one GPU: all share it, under MPS)."""
    import cupy

    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    count = cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(local % count).use()


def main():
    global RECORDS
    ap = argparse.ArgumentParser()
    ap.add_argument("--testdir", required=True)
    ap.add_argument("--record", required=True)
    ap.add_argument("--cupy", action="store_true")
    ap.add_argument("--backends", default="")
    ap.add_argument("--lift-gpu-skips", action="store_true")
    ap.add_argument("--lift-spawn-skip", action="store_true")
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest

    rank = rank_in_world()
    os.makedirs(args.record, exist_ok=True)
    log = os.open(os.path.join(args.record, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    RECORDS = Records(os.path.join(args.record, f"rank{rank}.jsonl"))
    RECORDS.write("start", pid=os.getpid(), rank=rank)

    sys.path.insert(0, args.testdir)
    sys.dont_write_bytecode = True
    import main as suite_main

    backends = [b for b in args.backends.split(",") if b]
    suite_setup_modules = suite_main.setup_modules

    def setup_modules(options):
        suite_setup_modules(options)
        if args.cupy:
            use_local_gpu()
            wrap_cupy_fill()
        if backends:
            narrow_backends(backends)
        if args.lift_gpu_skips:
            lift_gpu_skips()
        if args.lift_spawn_skip:
            lift_spawn_skip()

    suite_main.setup_modules = setup_modules

    class Program(suite_main.TestProgram):
        def runTests(self):
            if self.test is not None:
                RECORDS.write("tests", ids=list(test_ids(self.test)))
            self.testRunner = unittest.TextTestRunner(
                stream=sys.stderr, verbosity=2, resultclass=RecordingResult
            )
            super().runTests()

    argv = [os.path.join(args.testdir, "main.py")] + (["--cupy"] if args.cupy else []) + rest
    try:
        Program(module=None, argv=argv)
    except SystemExit:
        pass
    except BaseException:
        RECORDS.write("error", id="(test program)", detail=traceback.format_exc()[-2000:])
        sys.stderr.write(traceback.format_exc())
    RECORDS.write("done")
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(0)


if __name__ == "__main__":
    main()
