//! Command-line options of gpucoll-bench (nccl-tests names where they exist).

use gpucoll::{CollKind, Datatype, ReduceOp};
use std::path::PathBuf;

/// Which buffer placements to time for each size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    OutOfPlace,
    InPlace,
    Both,
}

impl Placement {
    pub fn out_of_place(self) -> bool {
        matches!(self, Placement::OutOfPlace | Placement::Both)
    }
    pub fn in_place(self) -> bool {
        matches!(self, Placement::InPlace | Placement::Both)
    }
    /// The number given to `--inplace`.
    pub fn code(self) -> u8 {
        match self {
            Placement::OutOfPlace => 0,
            Placement::InPlace => 1,
            Placement::Both => 2,
        }
    }
}

/// Parsed options.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// Multiplicative step between sizes (used when `step_bytes` is `None`).
    pub step_factor: u64,
    /// Linear step between sizes (`-i`), overriding the factor.
    pub step_bytes: Option<u64>,
    pub iters: usize,
    pub warmup: usize,
    pub check: bool,
    pub dtypes: Vec<Datatype>,
    pub ops: Vec<ReduceOp>,
    pub colls: Vec<CollKind>,
    pub root: usize,
    pub placement: Placement,
    pub json: Option<PathBuf>,
    /// `--svg FILE`: a plot of busbw against size (rank 0).
    pub svg: Option<PathBuf>,
    /// `--time-budget SECS`: cut each size's timed loop to about this long
    /// (estimated from the warmup calls), keeping at least `min_iters`.
    pub time_budget: Option<f64>,
    /// `--min-iters N`: the fewest timed calls the budget may leave.
    pub min_iters: usize,
    pub vs_mpi: bool,
    pub vs_nccl: bool,
    /// `--mode`: how calls are issued, each mode a table of its own.
    pub modes: Vec<Mode>,
    /// `--stream-maxbytes SIZE`: the largest size of the async and graph
    /// modes (`None`: `--maxbytes`).
    pub stream_max_bytes: Option<u64>,
    /// `--nccl-lib PATH`: the libnccl to load instead of the loader's.
    pub nccl_lib: Option<PathBuf>,
    /// `--graph-iters N`: the most calls captured into one graph.
    pub graph_iters: usize,
    /// `--ce 0|1|auto`: `GPUCOLL_CE` for gpucoll's communicator.
    pub ce: Option<String>,
    /// `--overlap`: also run each size's collective while a compute job
    /// runs on another stream (overlap.rs).
    pub overlap: bool,
    /// `--overlap-iters N`: loop count per thread of each compute launch
    /// (`None`: calibrated at the start to about 200 us per launch).
    pub overlap_iters: Option<u32>,
    /// `--overlap-launches N`: launches in one compute job.
    pub overlap_launches: usize,
    /// `--register`: register gpucoll's device buffers of each size with
    /// the peers (`Communicator::register`) before its warmup calls, and
    /// drop the registrations after the size (run.rs).
    pub register: bool,
    /// `--floor`: measure the host↔GPU signalling floor first (floor.rs)
    /// and quote every time as a multiple of it.
    pub floor: bool,
    /// `--algos LIST`: compare the automatic choice with forced algorithms
    /// in one job, interleaved (algos.rs); empty: the ordinary tables.
    pub algos: Vec<String>,
    /// `--algo-rounds N`: rounds per size of `--algos`.
    pub algo_rounds: usize,
    pub help: bool,
}

/// How a timed call is issued (nccl-tests' modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Each call waits for its result (gpucoll's blocking API; NCCL
    /// followed by a stream synchronize).
    Blocking,
    /// n calls queued on one CUDA stream, one synchronize at the end.
    Async,
    /// n calls captured once into a CUDA graph, the graph replayed.
    Graph,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Blocking, Mode::Async, Mode::Graph];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Blocking => "blocking",
            Mode::Async => "async",
            Mode::Graph => "graph",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether the mode queues work on a CUDA stream (CUDA backend only).
    pub fn on_stream(self) -> bool {
        self != Mode::Blocking
    }
}

impl Args {
    /// The largest size of `mode`'s tables.
    pub fn max_bytes_of(&self, mode: Mode) -> u64 {
        match (mode.on_stream(), self.stream_max_bytes) {
            (true, Some(m)) => m.min(self.max_bytes),
            _ => self.max_bytes,
        }
    }
}

impl Default for Args {
    fn default() -> Args {
        Args {
            min_bytes: 8,
            max_bytes: 64 << 20,
            step_factor: 2,
            step_bytes: None,
            iters: 20,
            warmup: 5,
            check: true,
            dtypes: vec![Datatype::F32],
            ops: vec![ReduceOp::Sum],
            colls: vec![CollKind::AllReduce],
            root: 0,
            placement: Placement::Both,
            json: None,
            svg: None,
            time_budget: None,
            min_iters: 5,
            vs_mpi: false,
            vs_nccl: false,
            modes: vec![Mode::Blocking],
            stream_max_bytes: None,
            nccl_lib: None,
            ce: None,
            overlap: false,
            overlap_iters: None,
            overlap_launches: 16,
            register: false,
            floor: false,
            algos: Vec::new(),
            algo_rounds: 3,
            graph_iters: 20,
            help: false,
        }
    }
}

pub const USAGE: &str = "\
usage: mpirun -n N gpucoll-bench [options]

Times gpucoll's collectives over a range of message sizes, nccl-tests style.

  -b, --minbytes SIZE       smallest size (default 8)
  -e, --maxbytes SIZE       largest size (default 64M)
  -f, --stepfactor N        multiply the size by N each step (default 2)
  -i, --stepbytes SIZE      add SIZE each step instead (linear sweep)
  -n, --iters N             timed iterations per size (default 20)
  -w, --warmup_iters N      untimed iterations before timing (default 5)
  -c, --check 0|1           verify every result (default 1)
  -d, --datatype LIST       float, double, half, bfloat16, int8, uint8, int32,
                            uint32, int64, uint64, or all (default float)
  -o, --op LIST             sum, prod, min, max, avg, premulsum[:scalar],
                            or all (default sum)
      --coll LIST           all_reduce, reduce, broadcast, all_gather,
                            reduce_scatter, all_to_all, gather, scatter,
                            scan, exclusive_scan (or exscan), or all
                            (default all_reduce)
  -r, --root N              root rank of rooted collectives (default 0)
      --inplace 0|1|2       0 out-of-place, 1 in-place, 2 both (default 2)
      --time-budget SECS    cut each timed loop to about SECS seconds (estimated
                            from the warmup calls; at least --min-iters calls,
                            at most --iters); default: always --iters calls
      --min-iters N         fewest calls --time-budget may leave (default 5)
      --json FILE           also write the results as JSON (rank 0)
      --svg FILE            also plot busbw against size as SVG (rank 0)
      --vs-mpi              also time MPI's own collective on the same data
                            (blocking tables)
      --vs-nccl             also time NCCL's collective on the same device
                            data in the same run (build with --features cuda;
                            needs the CUDA backend and libnccl). Sets
                            NCCL_NVLS_ENABLE=0 (NVLink multicast stays off).
                            NCCL is timed on ordinary device buffers and,
                            with NCCL >= 2.27, on symmetric windows
                            (ncclMemAlloc + ncclCommWindowRegister); ratios
                            are against the faster of the two (NCCL best)
      --nccl-lib PATH       the libnccl.so.2 to use with --vs-nccl (default:
                            libnccl.so.2, then libnccl.so, from the loader path)
      --mode LIST           blocking, async, graph, or all (default blocking):
                            blocking = each call waits for its result; async =
                            n calls queued on one CUDA stream through the raw
                            entry points, one synchronize; graph = the n calls
                            captured once into a CUDA graph, replayed. async
                            and graph need the CUDA backend (other backends
                            skip them when blocking is listed too, else exit 2)
      --stream-maxbytes SIZE  largest size of the async and graph tables
                            (default: --maxbytes)
      --graph-iters N       most calls captured into one graph (default 20,
                            nccl-tests' -n; fewer when --iters or
                            --time-budget say so); 4 timed replays
      --ce MODE             copy-engine collectives for all_gather,
                            all_to_all, broadcast, gather and scatter on one
                            node: 1 = always, 0 = never, auto = where the
                            tuner prefers them (default: GPUCOLL_CE, auto)
      --overlap             also run each size's collective (gpucoll, and NCCL
                            with --vs-nccl) while a compute job that fills
                            every SM runs on another stream; prints the job's
                            slowdown and the collective's time alone and
                            overlapped (CUDA backend; --mode blocking/async)
      --overlap-iters N     loops per thread of each compute launch (fixed
                            work; default: calibrated at the start to about
                            200 us per launch, printed in the header)
      --overlap-launches N  kernel launches in one compute job (default 16)
      --floor               first measure the host<->GPU signalling floor on
                            every rank at once (a resident GPU thread echoing
                            a word of mapped host memory; an empty kernel
                            launch + stream synchronize), print it, and add
                            an `x floor` column (time / the resident round
                            trip) to every table (CUDA backend)
      --register            register gpucoll's input and output device
                            buffers (in place: the one buffer) of each size
                            with every peer before its warmup calls
                            (Communicator::register, every rank alike), keep
                            them through the timed and checked calls (and
                            --overlap) and drop them after the size: times
                            the backend's registered-buffer path, where
                            all_reduce, reduce_scatter, all_gather and
                            broadcast run as kernels that read the peers'
                            inputs and write into their outputs (large calls
                            under GPUCOLL_REGISTERED=auto, the default).
                            CUDA backend only; NCCL's buffers are unchanged
      --algos LIST          instead of the tables above: the automatic choice
                            against forced algorithms in one job. LIST is
                            auto and GPUCOLL_ALGO values (ring, tree,
                            direct, oneshot, collnet), e.g. auto,ring,tree;
                            each gets a communicator of its own (the world's
                            duplicate with that GPUCOLL_ALGO) and, per size,
                            every round times each entry in turn, so drift
                            between runs falls on all alike. An entry may
                            add settings: auto+RESIDENT=0 is auto with
                            GPUCOLL_RESIDENT=0 (ALGO[+VAR=VALUE]...).
                            Blocking, out of place; time = median of the
                            rounds; each result checked; with --vs-mpi
                            MPI's own beside
      --algo-rounds N       rounds per size of --algos (default 3)
  -h, --help                this text

SIZE accepts K, M and G suffixes (powers of 1024). LIST is one name, a
comma-separated list, or all. Size is the largest buffer of a rank, in bytes:
the vector for all_reduce, reduce and broadcast (count = size / elem); the
whole gathered or scattered buffer for all_gather, reduce_scatter, all_to_all,
gather and scatter (count = size / (elem * ranks) elements per rank block).";

impl Args {
    /// The ops a table of `kind` runs for `dtype`: every `--op` that
    /// applies to it (`-o all` pairs the integer-only ops with integer
    /// types only), or one `None` for a collective that does not reduce.
    pub fn ops_for(&self, kind: CollKind, dtype: Datatype) -> Vec<Option<ReduceOp>> {
        if kind.reduces() {
            // A prefix cannot average (gpucoll refuses Avg for scans).
            let ops = self.ops.iter().copied();
            ops.filter(|op| op.applies_to(dtype) && !(kind.is_scan() && *op == ReduceOp::Avg))
                .map(Some)
                .collect()
        } else {
            vec![None]
        }
    }
}

/// The settings of one `--algos` entry `ALGO[+VAR=VALUE]...`: the
/// `GPUCOLL_ALGO` value (none for `auto`), then each `VAR` (with or without
/// its `GPUCOLL_` prefix) and its value, e.g. `auto+RESIDENT=0`.
pub fn entry_vars(entry: &str) -> Result<Vec<(String, String)>, String> {
    let mut parts = entry.split('+');
    let algo = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    if algo.is_empty() {
        return Err(format!(
            "--algos: {entry:?} names no algorithm (auto, ring, ...)"
        ));
    }
    let mut vars = Vec::new();
    if algo != "auto" {
        vars.push(("GPUCOLL_ALGO".to_string(), algo));
    }
    for setting in parts {
        let (var, value) = setting
            .split_once('=')
            .ok_or_else(|| format!("--algos: {setting:?} in {entry:?} is not VAR=VALUE"))?;
        let var = var.trim().to_ascii_uppercase();
        let var = if var.starts_with("GPUCOLL_") {
            var
        } else {
            format!("GPUCOLL_{var}")
        };
        vars.push((var, value.trim().to_string()));
    }
    Ok(vars)
}

/// `--algos`: entries of `auto` or a `GPUCOLL_ALGO` value, each with
/// optional `+VAR=VALUE` settings ([`entry_vars`]), each entry once, judged
/// by the library's own parser of those variables.
fn parse_algos(value: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for entry in value.split(',').map(str::trim) {
        // The algorithm in lower case, settings as given.
        let name = match entry.split_once('+') {
            Some((algo, rest)) => format!("{}+{rest}", algo.trim().to_ascii_lowercase()),
            None => entry.to_ascii_lowercase(),
        };
        if name.is_empty() {
            return Err(format!("--algos: empty entry in {value:?}"));
        }
        let vars = entry_vars(&name)?;
        gpucoll::Config::from_lookup(|v| vars.iter().find(|(k, _)| k == v).map(|(_, x)| x.clone()))
            .map_err(|e| format!("--algos: {e}"))?;
        if out.contains(&name) {
            return Err(format!("--algos: {name} is listed twice"));
        }
        out.push(name);
    }
    Ok(out)
}

/// Parse a byte size such as `8`, `64K`, `1M`, `2G` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix('B')
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(t);
    let (digits, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1u64 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1u64 << 30),
        _ => (t, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| format!("invalid size '{s}' (expected a number with optional K, M or G)"))
}

fn parse_num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.trim()
        .parse::<T>()
        .map_err(|_| format!("invalid value '{v}' for {name} (expected a non-negative integer)"))
}

fn parse_list<T: Clone>(
    name: &str,
    v: &str,
    all: &[T],
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    if v.trim().eq_ignore_ascii_case("all") {
        return Ok(all.to_vec());
    }
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        out.push(parse(item).ok_or_else(|| format!("unknown {name} '{item}'"))?);
    }
    if out.is_empty() {
        return Err(format!("empty {name} list"));
    }
    Ok(out)
}

/// Parse the arguments after the program name.
pub fn parse_args<I, S>(argv: I) -> Result<Args, String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut a = Args::default();
    let mut it = argv.into_iter().map(Into::into);
    while let Some(arg) = it.next() {
        // Split `--name=value` and `-bVALUE` forms.
        let (key, inline): (String, Option<String>) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((k, v)) => (format!("--{k}"), Some(v.to_string())),
                None => (arg.clone(), None),
            }
        } else if arg.starts_with('-') && arg.len() > 2 && !arg[1..2].starts_with('-') {
            (arg[..2].to_string(), Some(arg[2..].to_string()))
        } else {
            (arg.clone(), None)
        };
        let flag = |a: &mut Args, key: &str| -> Result<bool, String> {
            match key {
                "--vs-mpi" => a.vs_mpi = true,
                "--vs-nccl" => a.vs_nccl = true,
                "--overlap" => a.overlap = true,
                "--register" => a.register = true,
                "--floor" => a.floor = true,
                "-h" | "--help" => a.help = true,
                _ => return Ok(false),
            }
            Ok(true)
        };
        if flag(&mut a, &key)? {
            if inline.is_some() {
                return Err(format!("option {key} takes no value"));
            }
            continue;
        }
        let known = [
            "-b",
            "--minbytes",
            "-e",
            "--maxbytes",
            "-f",
            "--stepfactor",
            "-i",
            "--stepbytes",
            "-n",
            "--iters",
            "-w",
            "--warmup_iters",
            "-c",
            "--check",
            "-d",
            "--datatype",
            "-o",
            "--op",
            "--coll",
            "-r",
            "--root",
            "--inplace",
            "--json",
            "--svg",
            "--time-budget",
            "--min-iters",
            "--mode",
            "--stream-maxbytes",
            "--nccl-lib",
            "--graph-iters",
            "--ce",
            "--overlap-iters",
            "--overlap-launches",
            "--algos",
            "--algo-rounds",
        ];
        if !known.contains(&key.as_str()) {
            return Err(format!("unknown option '{arg}'"));
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .ok_or_else(|| format!("option {key} needs a value"))?,
        };
        match key.as_str() {
            "-b" | "--minbytes" => a.min_bytes = parse_size(&value)?,
            "-e" | "--maxbytes" => a.max_bytes = parse_size(&value)?,
            "-f" | "--stepfactor" => a.step_factor = parse_num(&key, &value)?,
            "-i" | "--stepbytes" => {
                let s = parse_size(&value)?;
                a.step_bytes = (s > 0).then_some(s);
            }
            "-n" | "--iters" => a.iters = parse_num(&key, &value)?,
            "-w" | "--warmup_iters" => a.warmup = parse_num(&key, &value)?,
            "-c" | "--check" => {
                a.check = match value.trim() {
                    "0" => false,
                    "1" => true,
                    _ => {
                        return Err(format!(
                            "invalid value '{value}' for {key} (expected 0 or 1)"
                        ))
                    }
                }
            }
            "-d" | "--datatype" => {
                a.dtypes = parse_list("datatype", &value, &Datatype::ALL, Datatype::parse)?
            }
            "-o" | "--op" => a.ops = parse_list("op", &value, &ReduceOp::ALL, ReduceOp::parse)?,
            "--coll" => {
                a.colls = parse_list("collective", &value, &CollKind::ALL, CollKind::parse)?
            }
            "-r" | "--root" => a.root = parse_num(&key, &value)?,
            "--inplace" => {
                a.placement = match value.trim() {
                    "0" => Placement::OutOfPlace,
                    "1" => Placement::InPlace,
                    "2" => Placement::Both,
                    _ => {
                        return Err(format!(
                            "invalid value '{value}' for {key} (expected 0, 1 or 2)"
                        ))
                    }
                }
            }
            "--json" => {
                if value.is_empty() {
                    return Err("--json needs a file name".into());
                }
                a.json = Some(PathBuf::from(value));
            }
            "--svg" => {
                if value.is_empty() {
                    return Err("--svg needs a file name".into());
                }
                a.svg = Some(PathBuf::from(value));
            }
            "--time-budget" => {
                let secs = value
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                    .ok_or_else(|| {
                        format!(
                            "invalid value '{value}' for {key} (expected seconds, \
                             greater than 0 and at most 3600)"
                        )
                    })?;
                a.time_budget = Some(secs);
            }
            "--min-iters" => a.min_iters = parse_num(&key, &value)?,
            "--mode" => {
                let mut modes = parse_list("mode", &value, &Mode::ALL, Mode::parse)?;
                // Keep the first mention of each mode (`async,async` runs once).
                let mut seen = Vec::new();
                modes.retain(|m| {
                    let new = !seen.contains(m);
                    seen.push(*m);
                    new
                });
                a.modes = modes;
            }
            "--stream-maxbytes" => a.stream_max_bytes = Some(parse_size(&value)?),
            "--graph-iters" => a.graph_iters = parse_num(&key, &value)?,
            "--ce" => {
                let v = value.to_ascii_lowercase();
                if !["0", "1", "auto"].contains(&v.as_str()) {
                    return Err(format!("--ce: expected 0, 1 or auto, got {value:?}"));
                }
                a.ce = Some(v);
            }
            "--overlap-iters" => {
                let n: u32 = parse_num(&key, &value)?;
                if n == 0 || n > MAX_OVERLAP_ITERS {
                    return Err(format!(
                        "--overlap-iters must be between 1 and {MAX_OVERLAP_ITERS}"
                    ));
                }
                a.overlap_iters = Some(n);
            }
            "--overlap-launches" => a.overlap_launches = parse_num(&key, &value)?,
            "--algos" => a.algos = parse_algos(&value)?,
            "--algo-rounds" => {
                a.algo_rounds = parse_num(&key, &value)?;
                if a.algo_rounds == 0 {
                    return Err("--algo-rounds must be at least 1".into());
                }
            }
            "--nccl-lib" => {
                if value.is_empty() {
                    return Err("--nccl-lib needs a file name".into());
                }
                a.nccl_lib = Some(PathBuf::from(value));
            }
            _ => unreachable!("listed in `known`"),
        }
    }
    if a.help {
        return Ok(a);
    }
    if a.min_bytes == 0 {
        return Err("--minbytes must be at least 1".into());
    }
    if a.min_bytes > a.max_bytes {
        return Err(format!(
            "--minbytes {} is larger than --maxbytes {}",
            a.min_bytes, a.max_bytes
        ));
    }
    if a.step_bytes.is_none() && a.step_factor < 2 && a.min_bytes != a.max_bytes {
        return Err("--stepfactor must be at least 2 (or use --stepbytes)".into());
    }
    if a.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if a.min_iters == 0 {
        return Err("--min-iters must be at least 1".into());
    }
    if a.stream_max_bytes.is_some_and(|m| m < a.min_bytes) {
        return Err("--stream-maxbytes is smaller than --minbytes".into());
    }
    if a.graph_iters == 0 {
        return Err("--graph-iters must be at least 1".into());
    }
    if a.nccl_lib.is_some() && !a.vs_nccl {
        return Err("--nccl-lib needs --vs-nccl".into());
    }
    check_overlap(&a)?;
    Ok(a)
}

/// The largest `--overlap-iters`: a launch of the compute job stays well
/// under the watchdogs' seconds even on a small GPU.
pub const MAX_OVERLAP_ITERS: u32 = 1 << 24;

/// The most launches of one compute job.
pub const MAX_OVERLAP_LAUNCHES: usize = 10_000;

fn check_overlap(a: &Args) -> Result<(), String> {
    if !a.overlap {
        if a.overlap_iters.is_some() || a.overlap_launches != Args::default().overlap_launches {
            return Err("--overlap-iters and --overlap-launches need --overlap".into());
        }
        return Ok(());
    }
    if a.overlap_launches == 0 || a.overlap_launches > MAX_OVERLAP_LAUNCHES {
        return Err(format!(
            "--overlap-launches must be between 1 and {MAX_OVERLAP_LAUNCHES}"
        ));
    }
    // A graph replays a fixed number of calls, while the overlap loop
    // issues calls until the compute job has ended.
    if a.modes.contains(&Mode::Graph) {
        return Err("--overlap runs with --mode blocking or async (not graph)".into());
    }
    Ok(())
}

/// The requested sizes in bytes of `mode`'s tables, before rounding to
/// whole elements.
pub fn sizes(a: &Args, mode: Mode) -> Vec<u64> {
    let mut out = Vec::new();
    let mut s = a.min_bytes;
    let max = a.max_bytes_of(mode);
    while s <= max {
        out.push(s);
        let next = match a.step_bytes {
            Some(step) => s.checked_add(step),
            None if a.step_factor >= 2 => s.checked_mul(a.step_factor),
            None => None,
        };
        match next {
            Some(n) if n > s => s = n,
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, String> {
        parse_args(s.split_whitespace())
    }

    #[test]
    fn defaults_match_nccl_tests() {
        let a = p("").unwrap();
        assert_eq!(a.min_bytes, 8);
        assert_eq!(a.max_bytes, 64 << 20);
        assert_eq!(a.step_factor, 2);
        assert_eq!(a.iters, 20);
        assert_eq!(a.warmup, 5);
        assert!(a.check);
        assert_eq!(a.dtypes, vec![Datatype::F32]);
        assert_eq!(a.colls, vec![CollKind::AllReduce]);
        assert_eq!(a.placement, Placement::Both);
        assert!(!a.vs_mpi && !a.vs_nccl);
        assert_eq!(a.modes, vec![Mode::Blocking]);
        assert_eq!((a.stream_max_bytes, a.nccl_lib.clone()), (None, None));
    }

    #[test]
    fn modes_and_nccl_library() {
        let a = p("--mode all --vs-nccl --nccl-lib /opt/nccl/libnccl.so.2").unwrap();
        assert_eq!(a.modes, vec![Mode::Blocking, Mode::Async, Mode::Graph]);
        assert_eq!(a.nccl_lib, Some(PathBuf::from("/opt/nccl/libnccl.so.2")));
        let b = p("--mode=graph,async,graph").unwrap();
        assert_eq!(b.modes, vec![Mode::Graph, Mode::Async]);
        assert_eq!(p("--mode ASYNC").unwrap().modes, vec![Mode::Async]);
        assert_eq!(p("").unwrap().graph_iters, 20);
        assert_eq!(p("--graph-iters 5").unwrap().graph_iters, 5);
        let c = p("-b 8 -e 1G --stream-maxbytes 64M --mode all").unwrap();
        assert_eq!(c.max_bytes_of(Mode::Blocking), 1 << 30);
        assert_eq!(c.max_bytes_of(Mode::Async), 64 << 20);
        assert_eq!(c.max_bytes_of(Mode::Graph), 64 << 20);
        assert_eq!(sizes(&c, Mode::Graph).last(), Some(&(64 << 20)));
        assert_eq!(sizes(&c, Mode::Blocking).last(), Some(&(1 << 30)));
        // A stream cap above --maxbytes changes nothing.
        let d = p("-e 1M --stream-maxbytes 1G").unwrap();
        assert_eq!(d.max_bytes_of(Mode::Async), 1 << 20);
        assert_eq!(Mode::parse(" graph "), Some(Mode::Graph));
        assert!(Mode::Async.on_stream() && !Mode::Blocking.on_stream());
        for bad in [
            "--mode",
            "--mode stream",
            "--mode ,",
            "--nccl-lib",
            "--nccl-lib=",
            "--nccl-lib /x/libnccl.so.2",
            "--stream-maxbytes 4 -b 8",
            "--stream-maxbytes x",
            "--graph-iters 0",
            "--graph-iters",
        ] {
            assert!(p(bad).is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("4KB").unwrap(), 4096);
        assert!(parse_size("M").is_err());
        assert!(parse_size("1.5M").is_err());
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn short_long_and_inline_forms() {
        let a = p("-b 1K -e1M --stepfactor=4 -n 5 -w 1 -c 0 -d float,int8 -o all --coll all -r 2 --inplace 0 --json out.json --vs-mpi").unwrap();
        assert_eq!(a.min_bytes, 1024);
        assert_eq!(a.max_bytes, 1 << 20);
        assert_eq!(a.step_factor, 4);
        assert_eq!(a.iters, 5);
        assert_eq!(a.warmup, 1);
        assert!(!a.check);
        assert_eq!(a.dtypes, vec![Datatype::F32, Datatype::I8]);
        assert_eq!(a.ops.len(), 12);
        assert_eq!(a.colls, CollKind::ALL.to_vec());
        assert!(a.colls.contains(&CollKind::ExclusiveScan));
        // Avg applies to every reduction but the prefixes.
        let avg = |k| a.ops_for(k, Datatype::F32).contains(&Some(ReduceOp::Avg));
        assert!(avg(CollKind::AllReduce) && !avg(CollKind::Scan) && !avg(CollKind::ExclusiveScan));
        assert_eq!(a.root, 2);
        assert_eq!(a.placement, Placement::OutOfPlace);
        assert_eq!(a.json, Some(PathBuf::from("out.json")));
        assert!(a.vs_mpi);
        let b = p("--datatype all --op premulsum:0.5 --coll reduce_scatter --vs-nccl").unwrap();
        assert_eq!(b.dtypes.len(), 10);
        assert_eq!(b.ops, vec![ReduceOp::PreMulSum(0.5)]);
        assert_eq!(b.colls, vec![CollKind::ReduceScatter]);
        assert!(b.vs_nccl);
        let s = p("--coll scan,exscan").unwrap();
        assert_eq!(s.colls, vec![CollKind::Scan, CollKind::ExclusiveScan]);
        let c = p("--vs-nccl --svg plot.svg --time-budget 0.25 --min-iters 3 -n 50").unwrap();
        assert_eq!(c.svg, Some(PathBuf::from("plot.svg")));
        assert_eq!(c.time_budget, Some(0.25));
        assert_eq!(c.min_iters, 3);
        assert_eq!(c.iters, 50);
        let d = p("--time-budget=2 --svg=x.svg").unwrap();
        assert_eq!(d.time_budget, Some(2.0));
        assert_eq!(d.svg, Some(PathBuf::from("x.svg")));
        assert_eq!(p("").unwrap().time_budget, None);
    }

    #[test]
    fn bad_arguments_are_errors() {
        for bad in [
            "-b",
            "-b x",
            "--bogus",
            "-d float16x",
            "-o xor",
            "--coll allreduce2",
            "-c 2",
            "--inplace 3",
            "-n 0",
            "-b 1M -e 1K",
            "-b 0",
            "-f 1",
            "--vs-mpi=1",
            "--vs-nccl=1",
            "-n -3",
            "--svg",
            "--svg=",
            "--time-budget 0",
            "--time-budget -1",
            "--time-budget nan",
            "--time-budget inf",
            "--time-budget 1e9",
            "--time-budget x",
            "--min-iters 0",
            "--min-iters",
        ] {
            assert!(p(bad).is_err(), "accepted: {bad}");
        }
        assert!(p("-h").unwrap().help);
    }

    #[test]
    fn overlap_options() {
        let a = p("").unwrap();
        assert!(!a.overlap);
        assert_eq!((a.overlap_iters, a.overlap_launches), (None, 16));
        let b = p("--overlap --overlap-iters 300 --overlap-launches=4 --mode async").unwrap();
        assert!(b.overlap);
        assert_eq!((b.overlap_iters, b.overlap_launches), (Some(300), 4));
        assert!(p("--overlap --mode blocking,async").unwrap().overlap);
        for bad in [
            "--overlap=1",
            "--overlap --mode graph",
            "--overlap --mode all",
            "--overlap --overlap-iters 0",
            "--overlap --overlap-iters 99999999",
            "--overlap --overlap-iters x",
            "--overlap --overlap-launches 0",
            "--overlap-iters 10",
            "--overlap-launches 2",
        ] {
            assert!(p(bad).is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn algos_option() {
        let a = p("--algos auto,ring,tree,collnet --algo-rounds 5").unwrap();
        assert_eq!(a.algos, ["auto", "ring", "tree", "collnet"]);
        assert_eq!(a.algo_rounds, 5);
        assert!(p("").unwrap().algos.is_empty());
        assert_eq!(p("").unwrap().algo_rounds, 3);
        assert_eq!(p("--algos=Ring").unwrap().algos, ["ring"]);
        for bad in [
            "--algos bogus",
            "--algos ring,,tree",
            "--algos ring,ring",
            "--algos",
            "--algo-rounds 0",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(USAGE.contains("--algos LIST"));
        let a = p("--algos Auto+RESIDENT=0,auto+GPUCOLL_RESIDENT=1,ring+nchannels=4").unwrap();
        assert_eq!(
            a.algos,
            [
                "auto+RESIDENT=0",
                "auto+GPUCOLL_RESIDENT=1",
                "ring+nchannels=4"
            ]
        );
        assert_eq!(
            entry_vars(&a.algos[0]).unwrap(),
            [("GPUCOLL_RESIDENT".to_string(), "0".to_string())]
        );
        assert_eq!(
            entry_vars(&a.algos[2]).unwrap(),
            [
                ("GPUCOLL_ALGO".to_string(), "ring".to_string()),
                ("GPUCOLL_NCHANNELS".to_string(), "4".to_string())
            ]
        );
        for bad in [
            "--algos auto+RESIDENT",
            "--algos auto+RESIDENT=maybe",
            "--algos +RESIDENT=1",
            "--algos auto+NCHANNELS=0",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn register_option() {
        assert!(!p("").unwrap().register);
        let a = p("--register --mode all --vs-nccl").unwrap();
        assert!(a.register && a.vs_nccl);
        assert_eq!(a.modes.len(), 3);
        assert!(p("--register --overlap --mode async").unwrap().register);
        for bad in ["--register=1", "--register=0", "--registered"] {
            assert!(p(bad).is_err(), "accepted: {bad}");
        }
        assert!(USAGE.contains("--register "));
        assert!(p("--floor").unwrap().floor);
        assert!(!p("").unwrap().floor);
        assert!(p("--floor=1").is_err());
    }

    #[test]
    fn size_sweeps() {
        let a = p("-b 8 -e 64 -f 2").unwrap();
        let m = Mode::Blocking;
        assert_eq!(sizes(&a, m), vec![8, 16, 32, 64]);
        let b = p("-b 8 -e 70 -f 4").unwrap();
        assert_eq!(sizes(&b, m), vec![8, 32]);
        let c = p("-b 10 -e 40 -i 10").unwrap();
        assert_eq!(sizes(&c, m), vec![10, 20, 30, 40]);
        let d = p("-b 1K -e 1K -f 1").unwrap();
        assert_eq!(sizes(&d, m), vec![1024]);
    }
}
