//! Table rows and JSON records, nccl-tests style.

use crate::args::Mode;
use gpucoll::CollKind;

/// nccl-tests' bus-bandwidth factor: algbw × factor is the bandwidth each
/// rank's busiest link carries, comparable across rank counts.
pub fn bus_factor(kind: CollKind, nranks: usize) -> f64 {
    let n = nranks as f64;
    match kind {
        CollKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::AllToAll
        | CollKind::Gather
        | CollKind::Scatter => (n - 1.0) / n,
        // A chain: every link but the last rank's carries the buffer once
        // (scan) or twice (exclusive_scan: each input, then each prefix),
        // which the factor 1 leaves visible as a halved busbw.
        CollKind::Broadcast | CollKind::Reduce | CollKind::Scan | CollKind::ExclusiveScan => 1.0,
    }
}

/// Whether a collective's size counts the whole gathered/scattered buffer
/// (`count` elements per rank block, `count * nranks` in total).
pub fn scaled_by_ranks(kind: CollKind) -> bool {
    matches!(
        kind,
        CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scatter
    )
}

/// Per-rank block count for a requested size, and the size actually used
/// (rounded down to whole elements and blocks).
pub fn count_for(kind: CollKind, bytes: u64, elem: usize, nranks: usize) -> (usize, u64) {
    let per = if scaled_by_ranks(kind) {
        elem as u64 * nranks as u64
    } else {
        elem as u64
    };
    let count = bytes / per;
    (count as usize, count * per)
}

/// algbw and busbw in GB/s for `bytes` moved in `seconds`.
pub fn bandwidths(kind: CollKind, nranks: usize, bytes: u64, seconds: f64) -> (f64, f64) {
    if seconds <= 0.0 {
        return (0.0, 0.0);
    }
    let alg = bytes as f64 / seconds / 1e9;
    (alg, alg * bus_factor(kind, nranks))
}

/// Time in µs, as nccl-tests prints it (7 wide).
pub fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// One timed placement of one size.
#[derive(Debug, Clone)]
pub struct Measure {
    pub in_place: bool,
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// Wrong elements summed over ranks; `None` when not checked.
    pub wrong: Option<u64>,
    /// Timed calls (fewer than `--iters` when `--time-budget` cut them).
    pub iters: usize,
}

/// NCCL's collective on the same device data (`--vs-nccl`).
#[derive(Debug, Clone)]
pub enum NcclMeasure {
    Time {
        /// Mean per call on ordinary device buffers, in the row's mode
        /// (blocking: each call followed by a stream synchronize).
        time_us: f64,
        algbw: f64,
        busbw: f64,
        /// Blocking rows: mean per call of a loop of calls with one
        /// synchronize at the end; async rows: `time_us`; graph rows: `None`.
        async_time_us: Option<f64>,
        iters: usize,
        /// Wrong elements summed over ranks; `None` when not checked.
        wrong: Option<u64>,
        /// The same on symmetric windows; `None` when this NCCL has none.
        sym: Option<SymMeasure>,
    },
    /// This libnccl has no such collective.
    Unsupported,
}

/// NCCL on symmetric-window buffers (`ncclMemAlloc` memory registered with
/// `ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)`).
#[derive(Debug, Clone)]
pub struct SymMeasure {
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub iters: usize,
    pub wrong: Option<u64>,
}

/// NCCL's faster buffer kind for one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Best {
    pub time_us: f64,
    pub busbw: f64,
    /// "ordinary" or "symmetric".
    pub kind: &'static str,
}

impl NcclMeasure {
    /// The faster of ordinary and symmetric-window buffers ("NCCL best");
    /// a kind whose results were wrong is never the best.
    pub fn best(&self) -> Option<Best> {
        match self {
            NcclMeasure::Time {
                time_us,
                busbw,
                sym,
                wrong,
                ..
            } => Some(match sym {
                Some(s)
                    if s.time_us > 0.0
                        && s.wrong.unwrap_or(0) == 0
                        && (s.time_us < *time_us || *time_us <= 0.0 || wrong.unwrap_or(0) > 0) =>
                {
                    Best {
                        time_us: s.time_us,
                        busbw: s.busbw,
                        kind: "symmetric",
                    }
                }
                _ => Best {
                    time_us: *time_us,
                    busbw: *busbw,
                    kind: "ordinary",
                },
            }),
            NcclMeasure::Unsupported => None,
        }
    }

    /// Wrong elements of every NCCL run of the row.
    pub fn wrong(&self) -> u64 {
        match self {
            NcclMeasure::Time { wrong, sym, .. } => {
                wrong.unwrap_or(0) + sym.as_ref().and_then(|s| s.wrong).unwrap_or(0)
            }
            NcclMeasure::Unsupported => 0,
        }
    }
}

/// MPI's own collective on the same data.
#[derive(Debug, Clone)]
pub enum MpiMeasure {
    Time(f64),
    /// MPI has no equivalent (for example f16 reductions, avg, premulsum).
    Unsupported,
}

/// gpucoll's buffers of one row registered with the peers (`--register`):
/// per placement, whether the peers map every rank's registered buffers
/// directly (`Registration::is_direct` on every rank; buffers of no bytes
/// do not count). `None`: that placement did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    pub out_of_place_direct: Option<bool>,
    pub in_place_direct: Option<bool>,
}

impl Registered {
    /// The figure of one placement.
    pub fn direct(&self, in_place: bool) -> Option<bool> {
        if in_place {
            self.in_place_direct
        } else {
            self.out_of_place_direct
        }
    }

    /// The table's cell: `yes`/`no` per placement shown, out-of-place
    /// first, joined by `/`.
    pub fn cell(&self, show_oop: bool, show_ip: bool) -> String {
        let yes_no = |d: Option<bool>| match d {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        let mut parts = Vec::new();
        if show_oop {
            parts.push(yes_no(self.out_of_place_direct));
        }
        if show_ip {
            parts.push(yes_no(self.in_place_direct));
        }
        parts.join("/")
    }
}

/// Everything printed on one line.
#[derive(Debug, Clone)]
pub struct Row {
    pub mode: Mode,
    pub coll: CollKind,
    pub dtype: &'static str,
    pub op: String,
    pub root: Option<usize>,
    pub bytes: u64,
    pub count: usize,
    /// Out-of-place then in-place, each present when run.
    pub out_of_place: Option<Measure>,
    pub in_place: Option<Measure>,
    pub mpi: Option<MpiMeasure>,
    pub nccl: Option<NcclMeasure>,
    /// `Some` when gpucoll's buffers were registered (`--register`).
    pub registered: Option<Registered>,
}

const GROUP_W: usize = 7 + 2 + 6 + 2 + 6 + 2 + 6;

fn fmt_measure(m: Option<&Measure>, shown: bool) -> String {
    if !shown {
        return String::new();
    }
    match m {
        Some(m) => {
            let wrong = match m.wrong {
                Some(w) => w.to_string(),
                None => "N/A".to_string(),
            };
            format!(
                "  {}  {:6.2}  {:6.2}  {:>6}",
                fmt_time(m.time_us),
                m.algbw,
                m.busbw,
                wrong
            )
        }
        None => format!("  {:>w$}", "n/a", w = GROUP_W),
    }
}

const NCCL_W: usize = 7 + 2 + 6 + 2 + 7 + 2 + 6 + 2 + 7 + 2 + 7 + 2 + 7 + 2 + 6 + 2 + 7 + 2 + 7;

/// Width of the `--register` column.
const REG_W: usize = 10;

/// Width of the `--floor` column.
const FLOOR_W: usize = 7;

/// `header` with the `x floor` column of `--floor` added to its three lines.
pub fn with_floor_header(header: &str) -> String {
    let cells = ["", "x floor", "(t/flr)"];
    header
        .lines()
        .enumerate()
        .map(|(i, l)| {
            format!(
                "{l}  {:>w$}",
                cells.get(i).copied().unwrap_or(""),
                w = FLOOR_W
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `x floor` cell of `row`: its reference time over the floor.
pub fn floor_cell(row: &Row, floor_us: f64) -> String {
    match row.reference() {
        Some(m) if floor_us > 0.0 && m.time_us > 0.0 => {
            format!("  {:>w$.2}", m.time_us / floor_us, w = FLOOR_W)
        }
        _ => format!("  {:>w$}", "-", w = FLOOR_W),
    }
}

/// A row's JSON object with `floor_us` and `x_floor` (its time over the
/// floor) added when `--floor` measured one.
pub fn with_floor_json(obj: String, floor_us: Option<f64>) -> String {
    let Some(f) = floor_us else {
        return obj;
    };
    let time = obj
        .split("\"time_us\":")
        .nth(1)
        .and_then(|rest| rest.split([',', '}']).next())
        .and_then(|t| t.trim().parse::<f64>().ok());
    let ratio = match time {
        Some(t) if f > 0.0 => json_num(t / f),
        _ => "null".to_string(),
    };
    match obj.strip_suffix('}') {
        Some(body) => format!("{body},\"floor_us\":{},\"x_floor\":{ratio}}}", json_num(f)),
        None => obj,
    }
}

/// The three header lines for a table of `mode`; `registered`: the last
/// column says whether the peers map gpucoll's registered buffers.
pub fn header(
    mode: Mode,
    show_oop: bool,
    show_ip: bool,
    vs_mpi: bool,
    vs_nccl: bool,
    registered: bool,
) -> String {
    let mut l1 = format!("#{:>54}", "");
    let mut l2 = format!(
        "#{:>11}  {:>12}  {:>8}  {:>9}  {:>6}",
        "size", "count", "type", "redop", "root"
    );
    let mut l3 = format!(
        "#{:>11}  {:>12}  {:>8}  {:>9}  {:>6}",
        "(B)", "(elements)", "", "", ""
    );
    for (show, name) in [(show_oop, "out-of-place"), (show_ip, "in-place")] {
        if show {
            l1.push_str(&format!("  {name:^w$}", w = GROUP_W));
            l2.push_str(&format!(
                "  {:>7}  {:>6}  {:>6}  {:>6}",
                "time", "algbw", "busbw", "#wrong"
            ));
            l3.push_str(&format!(
                "  {:>7}  {:>6}  {:>6}  {:>6}",
                "(us)", "(GB/s)", "(GB/s)", ""
            ));
        }
    }
    if vs_mpi {
        l1.push_str(&format!("  {:^18}", "MPI"));
        l2.push_str(&format!("  {:>9}  {:>7}", "mpi time", "ratio"));
        l3.push_str(&format!("  {:>9}  {:>7}", "(us)", "mpi/gc"));
    }
    if vs_nccl {
        let title = match mode {
            Mode::Blocking => "NCCL blocking (async loop; symmetric windows; best)",
            Mode::Async => "NCCL queued on a stream (symmetric windows; best)",
            Mode::Graph => "NCCL graph replay (symmetric windows; best)",
        };
        l1.push_str(&format!("  {title:^w$}", w = NCCL_W));
        l2.push_str(&format!(
            "  {:>7}  {:>6}  {:>7}  {:>6}  {:>7}  {:>7}  {:>7}  {:>6}  {:>7}  {:>7}",
            "time", "busbw", "async", "#wrong", "busbw", "time", "sym", "#wrong", "best", "time"
        ));
        l3.push_str(&format!(
            "  {:>7}  {:>6}  {:>7}  {:>6}  {:>7}  {:>7}  {:>7}  {:>6}  {:>7}  {:>7}",
            "(us)", "(GB/s)", "(us)", "", "gc/nccl", "gc/nccl", "(us)", "", "(us)", "gc/best"
        ));
    }
    if registered {
        l1.push_str(&format!("  {:>w$}", "registered", w = REG_W));
        l2.push_str(&format!("  {:>w$}", "direct", w = REG_W));
        let which = if show_oop && show_ip { "(oop/ip)" } else { "" };
        l3.push_str(&format!("  {which:>w$}", w = REG_W));
    }
    format!("{}\n{}\n{}", l1.trim_end(), l2, l3)
}

impl Row {
    /// The gpucoll measure the MPI and NCCL ratios compare against:
    /// out-of-place, or in-place when only that ran (broadcast).
    pub fn reference(&self) -> Option<&Measure> {
        self.out_of_place.as_ref().or(self.in_place.as_ref())
    }

    fn reference_time(&self) -> Option<f64> {
        self.reference().map(|m| m.time_us)
    }

    /// (busbw gpucoll / busbw NCCL, time gpucoll / time NCCL) for `m`.
    pub fn nccl_ratios_of(&self, m: &Measure) -> Option<(Option<f64>, Option<f64>)> {
        match &self.nccl {
            Some(NcclMeasure::Time { time_us, busbw, .. }) => Some((
                (*busbw > 0.0).then(|| m.busbw / busbw),
                (*time_us > 0.0).then(|| m.time_us / time_us),
            )),
            _ => None,
        }
    }

    /// (busbw gpucoll / busbw NCCL best, time gpucoll / time NCCL best).
    pub fn nccl_best_ratios_of(&self, m: &Measure) -> Option<(Option<f64>, Option<f64>)> {
        let b = self.nccl.as_ref()?.best()?;
        Some((
            (b.busbw > 0.0).then(|| m.busbw / b.busbw),
            (b.time_us > 0.0).then(|| m.time_us / b.time_us),
        ))
    }

    /// The NCCL ratios of the reference measure.
    pub fn nccl_ratios(&self) -> Option<(Option<f64>, Option<f64>)> {
        self.reference().and_then(|m| self.nccl_ratios_of(m))
    }

    /// mpi_time / gpucoll_time (> 1: gpucoll is faster).
    pub fn ratio(&self) -> Option<f64> {
        match (&self.mpi, self.reference_time()) {
            (Some(MpiMeasure::Time(t)), Some(g)) if g > 0.0 => Some(t / g),
            _ => None,
        }
    }

    pub fn format(&self, show_oop: bool, show_ip: bool, vs_mpi: bool, vs_nccl: bool) -> String {
        let root = match self.root {
            Some(r) => r as i64,
            None => -1,
        };
        let mut s = format!(
            " {:>11}  {:>12}  {:>8}  {:>9}  {:>6}",
            self.bytes, self.count, self.dtype, self.op, root
        );
        s.push_str(&fmt_measure(self.out_of_place.as_ref(), show_oop));
        s.push_str(&fmt_measure(self.in_place.as_ref(), show_ip));
        if vs_mpi {
            match (&self.mpi, self.ratio()) {
                (Some(MpiMeasure::Time(t)), Some(r)) => {
                    s.push_str(&format!("  {:>9}  {:7.2}", fmt_time(*t), r))
                }
                (Some(MpiMeasure::Time(t)), None) => {
                    s.push_str(&format!("  {:>9}  {:>7}", fmt_time(*t), "-"))
                }
                _ => s.push_str(&format!("  {:>9}  {:>7}", "n/a", "-")),
            }
        }
        if vs_nccl {
            let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.3}"));
            match (&self.nccl, self.nccl_ratios()) {
                (
                    Some(
                        n @ NcclMeasure::Time {
                            time_us,
                            busbw,
                            async_time_us,
                            wrong,
                            sym,
                            ..
                        },
                    ),
                    r,
                ) => {
                    let (rb, rt) = r.unwrap_or((None, None));
                    let wrong_s = |w: Option<u64>| w.map_or("N/A".to_string(), |w| w.to_string());
                    let best = n.best();
                    let best_ratio = self
                        .reference()
                        .and_then(|m| self.nccl_best_ratios_of(m))
                        .and_then(|r| r.1);
                    s.push_str(&format!(
                        "  {}  {:6.2}  {:>7}  {:>6}  {:>7}  {:>7}  {:>7}  {:>6}  {:>7}  {:>7}",
                        fmt_time(*time_us),
                        busbw,
                        async_time_us.map_or("-".to_string(), fmt_time),
                        wrong_s(*wrong),
                        ratio(rb),
                        ratio(rt),
                        sym.as_ref()
                            .map_or("n/a".to_string(), |m| fmt_time(m.time_us)),
                        sym.as_ref().map_or("-".to_string(), |m| wrong_s(m.wrong)),
                        best.map_or("-".to_string(), |b| fmt_time(b.time_us)),
                        ratio(best_ratio)
                    ))
                }
                _ => s.push_str(&format!("  {:>w$}", "n/a", w = NCCL_W)),
            }
        }
        if let Some(r) = &self.registered {
            s.push_str(&format!("  {:>w$}", r.cell(show_oop, show_ip), w = REG_W));
        }
        s
    }

    /// One JSON object per timed placement of this row; `nccl_lib` is the
    /// NCCL version and library file, when NCCL ran.
    pub fn json_objects(
        &self,
        ranks: usize,
        nodes: usize,
        backend: &str,
        nccl_lib: Option<(&str, &str)>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for m in [&self.out_of_place, &self.in_place].into_iter().flatten() {
            let mut fields = vec![
                format!("\"collective\":{}", json_str(self.coll.name())),
                format!("\"datatype\":{}", json_str(self.dtype)),
                format!("\"op\":{}", json_str(&self.op)),
                format!(
                    "\"root\":{}",
                    self.root.map_or("null".to_string(), |r| r.to_string())
                ),
                format!("\"size_bytes\":{}", self.bytes),
                format!("\"count\":{}", self.count),
                format!("\"in_place\":{}", m.in_place),
                format!("\"time_us\":{}", json_num(m.time_us)),
                format!("\"algbw_gbs\":{}", json_num(m.algbw)),
                format!("\"busbw_gbs\":{}", json_num(m.busbw)),
                format!(
                    "\"wrong\":{}",
                    m.wrong.map_or("null".to_string(), |w| w.to_string())
                ),
                format!("\"iters\":{}", m.iters),
                format!("\"ranks\":{ranks}"),
                format!("\"nodes\":{nodes}"),
                format!("\"backend\":{}", json_str(backend)),
                format!("\"mode\":{}", json_str(self.mode.name())),
                format!("\"registered\":{}", self.registered.is_some()),
                format!(
                    "\"registered_direct\":{}",
                    self.registered
                        .and_then(|r| r.direct(m.in_place))
                        .map_or("null".to_string(), |d| d.to_string())
                ),
            ];
            match &self.mpi {
                Some(MpiMeasure::Time(t)) => {
                    fields.push(format!("\"mpi_time_us\":{}", json_num(*t)));
                    let ratio = if m.time_us > 0.0 {
                        Some(t / m.time_us)
                    } else {
                        None
                    };
                    fields.push(format!(
                        "\"mpi_ratio\":{}",
                        ratio.map_or("null".to_string(), json_num)
                    ));
                }
                Some(MpiMeasure::Unsupported) => {
                    fields.push("\"mpi_time_us\":null".to_string());
                    fields.push("\"mpi_ratio\":null".to_string());
                }
                None => {}
            }
            if let (Some((version, lib)), Some(_)) = (nccl_lib, &self.nccl) {
                fields.push(format!("\"nccl_version\":{}", json_str(version)));
                fields.push(format!("\"nccl_lib\":{}", json_str(lib)));
            }
            match &self.nccl {
                Some(
                    n @ NcclMeasure::Time {
                        time_us,
                        algbw,
                        busbw,
                        async_time_us,
                        iters,
                        wrong,
                        sym,
                    },
                ) => {
                    let (rb, rt) = self.nccl_ratios_of(m).unwrap_or((None, None));
                    let opt = |x: Option<f64>| x.map_or("null".to_string(), json_num);
                    let count = |w: Option<u64>| w.map_or("null".to_string(), |w| w.to_string());
                    fields.push("\"nccl\":true".to_string());
                    fields.push(format!("\"nccl_time_us\":{}", json_num(*time_us)));
                    fields.push(format!("\"nccl_algbw_gbs\":{}", json_num(*algbw)));
                    fields.push(format!("\"nccl_busbw_gbs\":{}", json_num(*busbw)));
                    fields.push(format!("\"nccl_async_time_us\":{}", opt(*async_time_us)));
                    fields.push(format!("\"nccl_iters\":{iters}"));
                    fields.push(format!("\"nccl_wrong\":{}", count(*wrong)));
                    fields.push(format!("\"busbw_ratio_vs_nccl\":{}", opt(rb)));
                    fields.push(format!("\"time_ratio_vs_nccl\":{}", opt(rt)));
                    fields.push(format!("\"nccl_sym\":{}", sym.is_some()));
                    let s = sym.as_ref();
                    fields.push(format!(
                        "\"nccl_sym_time_us\":{}",
                        opt(s.map(|s| s.time_us))
                    ));
                    fields.push(format!(
                        "\"nccl_sym_algbw_gbs\":{}",
                        opt(s.map(|s| s.algbw))
                    ));
                    fields.push(format!(
                        "\"nccl_sym_busbw_gbs\":{}",
                        opt(s.map(|s| s.busbw))
                    ));
                    fields.push(format!(
                        "\"nccl_sym_iters\":{}",
                        s.map_or("null".to_string(), |s| s.iters.to_string())
                    ));
                    fields.push(format!(
                        "\"nccl_sym_wrong\":{}",
                        count(s.and_then(|s| s.wrong))
                    ));
                    let best = n.best();
                    let (bb, bt) = self.nccl_best_ratios_of(m).unwrap_or((None, None));
                    fields.push(format!(
                        "\"nccl_best\":{}",
                        best.map_or("null".to_string(), |b| json_str(b.kind))
                    ));
                    fields.push(format!(
                        "\"nccl_best_time_us\":{}",
                        opt(best.map(|b| b.time_us))
                    ));
                    fields.push(format!(
                        "\"nccl_best_busbw_gbs\":{}",
                        opt(best.map(|b| b.busbw))
                    ));
                    fields.push(format!("\"busbw_ratio_vs_nccl_best\":{}", opt(bb)));
                    fields.push(format!("\"time_ratio_vs_nccl_best\":{}", opt(bt)));
                }
                Some(NcclMeasure::Unsupported) => {
                    fields.push("\"nccl\":false".to_string());
                    for k in [
                        "nccl_time_us",
                        "nccl_algbw_gbs",
                        "nccl_busbw_gbs",
                        "nccl_async_time_us",
                        "nccl_wrong",
                        "busbw_ratio_vs_nccl",
                        "time_ratio_vs_nccl",
                        "nccl_sym_time_us",
                        "nccl_best",
                        "nccl_best_time_us",
                        "nccl_best_busbw_gbs",
                        "busbw_ratio_vs_nccl_best",
                        "time_ratio_vs_nccl_best",
                    ] {
                        fields.push(format!("\"{k}\":null"));
                    }
                }
                None => {}
            }
            out.push(format!("{{{}}}", fields.join(",")));
        }
        out
    }
}

/// Human size: 8 B, 64 KiB, 1 GiB.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut i = 0;
    let mut v = b as f64;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// The rows of each (collective, datatype, op), in first-seen order.
pub fn series(rows: &[Row]) -> Vec<Vec<&Row>> {
    let mut out: Vec<Vec<&Row>> = Vec::new();
    for r in rows {
        match out.iter_mut().find(|s| {
            let f = s[0];
            f.coll == r.coll && f.dtype == r.dtype && f.op == r.op
        }) {
            Some(s) => s.push(r),
            None => out.push(vec![r]),
        }
    }
    out
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number (non-finite values become null).
pub fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".to_string()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A row of `mode` with NCCL beside it (its symmetric time when `sym_us`).
    pub(crate) fn nccl_row(mode: Mode, ordinary_us: f64, sym_us: Option<f64>) -> Row {
        let m = Measure {
            in_place: false,
            time_us: 8.0,
            algbw: 0.5,
            busbw: 0.5,
            wrong: Some(0),
            iters: 20,
        };
        Row {
            mode,
            coll: CollKind::AllGather,
            dtype: "float",
            op: "none".into(),
            root: None,
            bytes: 4096,
            count: 512,
            out_of_place: Some(m),
            in_place: None,
            mpi: None,
            nccl: Some(NcclMeasure::Time {
                time_us: ordinary_us,
                algbw: 4.0 / ordinary_us,
                busbw: 4.0 / ordinary_us,
                async_time_us: (mode == Mode::Async).then_some(ordinary_us),
                iters: 20,
                wrong: Some(0),
                sym: sym_us.map(|t| SymMeasure {
                    time_us: t,
                    algbw: 4.0 / t,
                    busbw: 4.0 / t,
                    iters: 20,
                    wrong: Some(0),
                }),
            }),
            registered: None,
        }
    }

    #[test]
    fn nccl_best_of_ordinary_and_symmetric() {
        // Symmetric faster: best is symmetric, ratios against it.
        let r = nccl_row(Mode::Graph, 10.0, Some(4.0));
        let n = r.nccl.as_ref().unwrap();
        let b = n.best().unwrap();
        assert_eq!((b.time_us, b.kind), (4.0, "symmetric"));
        assert_eq!(n.wrong(), 0);
        // Wrong results never count as the best.
        let mut bad = r.clone();
        if let Some(NcclMeasure::Time { sym: Some(s), .. }) = bad.nccl.as_mut() {
            s.wrong = Some(3);
        }
        let nb = bad.nccl.as_ref().unwrap();
        assert_eq!((nb.best().unwrap().kind, nb.wrong()), ("ordinary", 3));
        let (_, rt) = r.nccl_best_ratios_of(r.reference().unwrap()).unwrap();
        assert_eq!(rt, Some(2.0));
        let line = r.format(true, false, false, true);
        assert!(line.contains("   4.00") && line.contains("2.000"), "{line}");
        // Graph rows have no async column.
        assert!(line.contains("       -"), "{line}");
        let js = &r.json_objects(2, 1, "cuda", Some(("2.28.9", "/x/libnccl.so.2")))[0];
        for want in [
            "\"mode\":\"graph\"",
            "\"nccl_version\":\"2.28.9\"",
            "\"nccl_lib\":\"/x/libnccl.so.2\"",
            "\"nccl_time_us\":10",
            "\"nccl_async_time_us\":null",
            "\"nccl_sym\":true",
            "\"nccl_sym_time_us\":4",
            "\"nccl_sym_wrong\":0",
            "\"nccl_best\":\"symmetric\"",
            "\"nccl_best_time_us\":4",
            "\"time_ratio_vs_nccl\":0.8",
            "\"time_ratio_vs_nccl_best\":2",
        ] {
            assert!(js.contains(want), "{want} missing in {js}");
        }
        // Ordinary faster, or no symmetric windows: best is ordinary.
        let o = nccl_row(Mode::Async, 3.0, Some(4.0));
        assert_eq!(o.nccl.as_ref().unwrap().best().unwrap().kind, "ordinary");
        let none = nccl_row(Mode::Blocking, 3.0, None);
        let b = none.nccl.as_ref().unwrap().best().unwrap();
        assert_eq!((b.time_us, b.kind), (3.0, "ordinary"));
        let js = &none.json_objects(2, 1, "cuda", None)[0];
        assert!(js.contains("\"nccl_sym\":false") && js.contains("\"nccl_sym_time_us\":null"));
        assert!(!js.contains("nccl_version"));
        assert!(none.format(true, false, false, true).contains("n/a"));
        assert_eq!(NcclMeasure::Unsupported.best(), None);
        // Headers name the mode's NCCL figures.
        assert!(header(Mode::Graph, true, false, false, true, false).contains("graph replay"));
        assert!(header(Mode::Async, true, false, false, true, false).contains("queued"));
    }

    #[test]
    fn registered_rows() {
        let mut r = nccl_row(Mode::Async, 10.0, None);
        let plain = r.json_objects(2, 1, "cuda", None);
        assert!(plain[0].contains("\"registered\":false,\"registered_direct\":null"));
        let hdr = header(Mode::Async, true, false, false, true, false);
        assert!(!hdr.contains("registered"));
        let before = r.format(true, false, false, true);
        r.in_place = Some(Measure {
            in_place: true,
            ..r.out_of_place.clone().unwrap()
        });
        r.registered = Some(Registered {
            out_of_place_direct: Some(true),
            in_place_direct: Some(false),
        });
        // One column more at the end; the others are unchanged.
        let line = r.format(true, false, false, true);
        assert!(line.starts_with(before.as_str()), "{line}");
        assert!(line.ends_with("       yes"), "{line}");
        assert!(r.format(true, true, false, true).ends_with("    yes/no"));
        assert!(r.format(false, true, false, false).ends_with("        no"));
        let hdr = header(Mode::Async, true, true, false, true, true);
        let lines: Vec<&str> = hdr.lines().collect();
        assert!(lines[0].ends_with("registered") && lines[1].ends_with("    direct"));
        assert!(lines[2].ends_with("  (oop/ip)"), "{hdr}");
        assert!(header(Mode::Blocking, false, true, false, false, true)
            .lines()
            .nth(2)
            .is_some_and(|l| !l.contains("oop")));
        let js = r.json_objects(2, 1, "cuda", None);
        assert!(js[0].contains("\"in_place\":false") && js[1].contains("\"in_place\":true"));
        assert!(js[0].contains("\"registered\":true,\"registered_direct\":true"));
        assert!(js[1].contains("\"registered\":true,\"registered_direct\":false"));
        let unknown = Registered {
            out_of_place_direct: None,
            in_place_direct: Some(true),
        };
        assert_eq!(unknown.cell(true, true), "-/yes");
        assert_eq!(unknown.direct(false), None);
    }

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(bus_factor(CollKind::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(CollKind::AllReduce, 2), 1.0);
        assert_eq!(bus_factor(CollKind::AllGather, 4), 0.75);
        assert_eq!(bus_factor(CollKind::ReduceScatter, 8), 0.875);
        assert_eq!(bus_factor(CollKind::AllToAll, 2), 0.5);
        assert_eq!(bus_factor(CollKind::Gather, 4), 0.75);
        assert_eq!(bus_factor(CollKind::Scatter, 4), 0.75);
        assert_eq!(bus_factor(CollKind::Broadcast, 4), 1.0);
        assert_eq!(bus_factor(CollKind::Reduce, 4), 1.0);
        assert_eq!(bus_factor(CollKind::AllReduce, 1), 0.0);
    }

    #[test]
    fn counts_follow_nccl_tests() {
        assert_eq!(count_for(CollKind::AllReduce, 1024, 4, 4), (256, 1024));
        assert_eq!(count_for(CollKind::AllGather, 1024, 4, 4), (64, 1024));
        assert_eq!(count_for(CollKind::AllToAll, 100, 4, 4), (6, 96));
        assert_eq!(count_for(CollKind::Gather, 8, 4, 4), (0, 0));
        assert_eq!(count_for(CollKind::Broadcast, 9, 2, 3), (4, 8));
    }

    #[test]
    fn bandwidth_math() {
        let (alg, bus) = bandwidths(CollKind::AllReduce, 4, 1_000_000_000, 1.0);
        assert!((alg - 1.0).abs() < 1e-12);
        assert!((bus - 1.5).abs() < 1e-12);
        assert_eq!(bandwidths(CollKind::AllReduce, 4, 8, 0.0), (0.0, 0.0));
    }

    /// A blocking all_reduce row of 1 KiB with MPI and NCCL beside it.
    pub(crate) fn sample_row() -> Row {
        let m = Measure {
            in_place: false,
            time_us: 12.5,
            algbw: 0.1,
            busbw: 0.15,
            wrong: Some(0),
            iters: 20,
        };
        Row {
            mode: Mode::Blocking,
            coll: CollKind::AllReduce,
            dtype: "float",
            op: "sum".into(),
            root: None,
            bytes: 1024,
            count: 256,
            out_of_place: Some(m.clone()),
            in_place: Some(Measure {
                in_place: true,
                ..m
            }),
            mpi: Some(MpiMeasure::Time(25.0)),
            nccl: Some(NcclMeasure::Time {
                time_us: 5.0,
                algbw: 0.2,
                busbw: 0.3,
                async_time_us: Some(4.0),
                sym: None,
                iters: 20,
                wrong: Some(0),
            }),
            registered: None,
        }
    }

    #[test]
    fn rows_format_and_serialize() {
        let row = sample_row();
        assert_eq!(row.ratio(), Some(2.0));
        let (rb, rt) = row.nccl_ratios().unwrap();
        assert!((rb.unwrap() - 0.5).abs() < 1e-12 && (rt.unwrap() - 2.5).abs() < 1e-12);
        let nline = row.format(true, true, false, true);
        assert!(nline.contains("0.500") && nline.contains("2.500") && nline.contains("4.00"));
        let hdr = header(Mode::Blocking, true, true, false, true, false);
        assert!(hdr.contains("NCCL") && hdr.contains("gc/nccl"));
        assert_eq!(hdr.lines().count(), 3);
        let line = row.format(true, true, true, false);
        assert!(line.contains("12.50") && line.contains("2.00") && line.contains("  -1"));
        let js = row.json_objects(4, 1, "host", None);
        assert_eq!(js.len(), 2);
        assert!(js[0].starts_with("{\"collective\":\"all_reduce\""));
        assert!(js[1].contains("\"in_place\":true"));
        assert!(js[0].contains("\"mpi_ratio\":2"));
        assert!(js[0].contains("\"nccl_busbw_gbs\":0.3"));
        assert!(js[0].contains("\"busbw_ratio_vs_nccl\":0.5"));
        assert!(js[0].contains("\"iters\":20"));
        let mut un = row.clone();
        un.nccl = Some(NcclMeasure::Unsupported);
        assert!(un
            .format(true, true, false, true)
            .trim_end()
            .ends_with("n/a"));
        assert!(un.json_objects(2, 1, "cuda", None)[0].contains("\"nccl_time_us\":null"));
        assert_eq!(fmt_bytes(8), "8 B");
        assert_eq!(fmt_bytes(1 << 30), "1 GiB");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(json_str("a\"b"), "\"a\\\"b\"");
        assert_eq!(json_num(f64::NAN), "null");
    }

    #[test]
    fn floor_column_and_json() {
        let hdr = with_floor_header("# a\n# b\n# c");
        let lines: Vec<&str> = hdr.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[1].ends_with("x floor") && lines[2].ends_with("(t/flr)"),
            "{hdr}"
        );
        let js = with_floor_json("{\"time_us\":10.0,\"busbw\":1}".to_string(), Some(5.0));
        assert!(
            js.contains("\"floor_us\":") && js.contains("\"x_floor\":2"),
            "{js}"
        );
        assert_eq!(with_floor_json("{\"a\":1}".to_string(), None), "{\"a\":1}");
        assert!(with_floor_json("{\"a\":1}".to_string(), Some(5.0)).contains("\"x_floor\":null"));
    }
}
