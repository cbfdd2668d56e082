//! Table rows and JSON records, nccl-tests style.

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
        CollKind::Broadcast | CollKind::Reduce => 1.0,
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
        /// Mean of blocking calls (each followed by a stream synchronize).
        time_us: f64,
        algbw: f64,
        busbw: f64,
        /// Mean per call of a loop of calls with one synchronize at the end.
        async_time_us: f64,
        iters: usize,
        /// Wrong elements summed over ranks; `None` when not checked.
        wrong: Option<u64>,
    },
    /// This libnccl has no such collective.
    Unsupported,
}

/// MPI's own collective on the same data.
#[derive(Debug, Clone)]
pub enum MpiMeasure {
    Time(f64),
    /// MPI has no equivalent (for example f16 reductions, avg, premulsum).
    Unsupported,
}

/// Everything printed on one line.
#[derive(Debug, Clone)]
pub struct Row {
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

const NCCL_W: usize = 7 + 2 + 6 + 2 + 7 + 2 + 6 + 2 + 7 + 2 + 7;

/// The three header lines for a table.
pub fn header(show_oop: bool, show_ip: bool, vs_mpi: bool, vs_nccl: bool) -> String {
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
        l1.push_str(&format!(
            "  {:^w$}",
            "NCCL (blocking; async loop)",
            w = NCCL_W
        ));
        l2.push_str(&format!(
            "  {:>7}  {:>6}  {:>7}  {:>6}  {:>7}  {:>7}",
            "time", "busbw", "async", "#wrong", "busbw", "time"
        ));
        l3.push_str(&format!(
            "  {:>7}  {:>6}  {:>7}  {:>6}  {:>7}  {:>7}",
            "(us)", "(GB/s)", "(us)", "", "gc/nccl", "gc/nccl"
        ));
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
                    Some(NcclMeasure::Time {
                        time_us,
                        busbw,
                        async_time_us,
                        wrong,
                        ..
                    }),
                    r,
                ) => {
                    let (rb, rt) = r.unwrap_or((None, None));
                    s.push_str(&format!(
                        "  {}  {:6.2}  {}  {:>6}  {:>7}  {:>7}",
                        fmt_time(*time_us),
                        busbw,
                        fmt_time(*async_time_us),
                        wrong.map_or("N/A".to_string(), |w| w.to_string()),
                        ratio(rb),
                        ratio(rt)
                    ))
                }
                _ => s.push_str(&format!("  {:>w$}", "n/a", w = NCCL_W)),
            }
        }
        s
    }

    /// One JSON object per timed placement of this row.
    pub fn json_objects(&self, ranks: usize, nodes: usize, backend: &str) -> Vec<String> {
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
            match &self.nccl {
                Some(NcclMeasure::Time {
                    time_us,
                    algbw,
                    busbw,
                    async_time_us,
                    iters,
                    wrong,
                }) => {
                    let (rb, rt) = self.nccl_ratios_of(m).unwrap_or((None, None));
                    let opt = |x: Option<f64>| x.map_or("null".to_string(), json_num);
                    fields.push("\"nccl\":true".to_string());
                    fields.push(format!("\"nccl_time_us\":{}", json_num(*time_us)));
                    fields.push(format!("\"nccl_algbw_gbs\":{}", json_num(*algbw)));
                    fields.push(format!("\"nccl_busbw_gbs\":{}", json_num(*busbw)));
                    fields.push(format!(
                        "\"nccl_async_time_us\":{}",
                        json_num(*async_time_us)
                    ));
                    fields.push(format!("\"nccl_iters\":{iters}"));
                    fields.push(format!(
                        "\"nccl_wrong\":{}",
                        wrong.map_or("null".to_string(), |w| w.to_string())
                    ));
                    fields.push(format!("\"busbw_ratio_vs_nccl\":{}", opt(rb)));
                    fields.push(format!("\"time_ratio_vs_nccl\":{}", opt(rt)));
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

/// Sizes up to this count as small messages in the summary's latency.
pub const LATENCY_MAX_BYTES: u64 = 1024;

/// A Markdown table (each line prefixed with `# `) of gpucoll against NCCL
/// per collective: busbw at the largest size, peak busbw, small-message
/// latency (the smallest mean time over sizes up to 1 KiB, or at the
/// smallest size), and the geometric mean of the time ratio over all sizes.
/// Empty when no row has NCCL figures.
pub fn nccl_summary(rows: &[Row]) -> Vec<String> {
    if !rows.iter().any(|r| r.nccl.is_some()) {
        return Vec::new();
    }
    let mut out = vec![
        "# gpucoll vs NCCL (gc = gpucoll out-of-place, in-place for broadcast; NCCL = blocking \
         calls; ratios gc/nccl: busbw ratio < 1 and time ratio > 1 mean NCCL is faster; \
         latency = smallest mean time over sizes <= 1 KiB)"
            .to_string(),
        "# | collective | type | op | largest | busbw gc | busbw nccl | ratio | peak gc | \
         peak nccl | ratio | latency gc (us) | latency nccl (us) | ratio | time ratio \
         geomean |"
            .to_string(),
        "# |---|---|---|---|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for s in series(rows) {
        let f = s[0];
        let both: Vec<(&Row, &Measure, f64, f64)> = s
            .iter()
            .filter_map(|r| match (&r.nccl, r.reference()) {
                (Some(NcclMeasure::Time { time_us, busbw, .. }), Some(m)) => {
                    Some((*r, m, *time_us, *busbw))
                }
                _ => None,
            })
            .collect();
        let name = format!("# | {} | {} | {} |", f.coll.name(), f.dtype, f.op);
        let (Some(first), Some(last)) = (both.first(), both.last()) else {
            out.push(format!("{name} n/a | | | | | | | | | | |"));
            continue;
        };
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!("{:.3}", a / b)
            } else {
                "-".to_string()
            }
        };
        let peak_gc = both.iter().map(|x| x.1.busbw).fold(0.0, f64::max);
        let peak_nccl = both.iter().map(|x| x.3).fold(0.0, f64::max);
        let small: Vec<_> = both
            .iter()
            .filter(|x| x.0.bytes <= LATENCY_MAX_BYTES.max(first.0.bytes))
            .collect();
        let lat_gc = small
            .iter()
            .map(|x| x.1.time_us)
            .fold(f64::INFINITY, f64::min);
        let lat_nccl = small.iter().map(|x| x.2).fold(f64::INFINITY, f64::min);
        let logs: Vec<f64> = both
            .iter()
            .filter(|x| x.1.time_us > 0.0 && x.2 > 0.0)
            .map(|x| (x.1.time_us / x.2).ln())
            .collect();
        let geo = if logs.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{:.3}",
                (logs.iter().sum::<f64>() / logs.len() as f64).exp()
            )
        };
        out.push(format!(
            "{name} {} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {} | {} |",
            fmt_bytes(last.0.bytes),
            last.1.busbw,
            last.3,
            ratio(last.1.busbw, last.3),
            peak_gc,
            peak_nccl,
            ratio(peak_gc, peak_nccl),
            lat_gc,
            lat_nccl,
            ratio(lat_gc, lat_nccl),
            geo
        ));
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
mod tests {
    use super::*;

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

    #[test]
    fn rows_format_and_serialize() {
        let m = Measure {
            in_place: false,
            time_us: 12.5,
            algbw: 0.1,
            busbw: 0.15,
            wrong: Some(0),
            iters: 20,
        };
        let row = Row {
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
                async_time_us: 4.0,
                iters: 20,
                wrong: Some(0),
            }),
        };
        assert_eq!(row.ratio(), Some(2.0));
        let (rb, rt) = row.nccl_ratios().unwrap();
        assert!((rb.unwrap() - 0.5).abs() < 1e-12 && (rt.unwrap() - 2.5).abs() < 1e-12);
        let nline = row.format(true, true, false, true);
        assert!(nline.contains("0.500") && nline.contains("2.500") && nline.contains("4.00"));
        let hdr = header(true, true, false, true);
        assert!(hdr.contains("NCCL") && hdr.contains("gc/nccl"));
        assert_eq!(hdr.lines().count(), 3);
        let line = row.format(true, true, true, false);
        assert!(line.contains("12.50") && line.contains("2.00") && line.contains("  -1"));
        let js = row.json_objects(4, 1, "host");
        assert_eq!(js.len(), 2);
        assert!(js[0].starts_with("{\"collective\":\"all_reduce\""));
        assert!(js[1].contains("\"in_place\":true"));
        assert!(js[0].contains("\"mpi_ratio\":2"));
        assert!(js[0].contains("\"nccl_busbw_gbs\":0.3"));
        assert!(js[0].contains("\"busbw_ratio_vs_nccl\":0.5"));
        assert!(js[0].contains("\"iters\":20"));
        let sum = nccl_summary(std::slice::from_ref(&row));
        assert_eq!(sum.len(), 4);
        assert!(sum[3].starts_with("# | all_reduce | float | sum | 1 KiB | 0.15 | 0.30 | 0.500"));
        let mut un = row.clone();
        un.nccl = Some(NcclMeasure::Unsupported);
        assert!(un
            .format(true, true, false, true)
            .trim_end()
            .ends_with("n/a"));
        assert!(un.json_objects(2, 1, "cuda")[0].contains("\"nccl_time_us\":null"));
        assert!(nccl_summary(&[un])[3].contains("n/a"));
        assert_eq!(fmt_bytes(8), "8 B");
        assert_eq!(fmt_bytes(1 << 30), "1 GiB");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(json_str("a\"b"), "\"a\\\"b\"");
        assert_eq!(json_num(f64::NAN), "null");
    }

    #[test]
    fn nccl_summary_uses_small_sizes_for_latency() {
        let mk = |bytes: u64, gc_us: f64, nccl_us: f64| Row {
            coll: CollKind::AllGather,
            dtype: "float",
            op: "none".into(),
            root: None,
            bytes,
            count: 1,
            out_of_place: Some(Measure {
                in_place: false,
                time_us: gc_us,
                algbw: bytes as f64 / gc_us / 1e3,
                busbw: bytes as f64 / gc_us / 2e3,
                wrong: Some(0),
                iters: 5,
            }),
            in_place: None,
            mpi: None,
            nccl: Some(NcclMeasure::Time {
                time_us: nccl_us,
                algbw: bytes as f64 / nccl_us / 1e3,
                busbw: bytes as f64 / nccl_us / 2e3,
                async_time_us: nccl_us,
                iters: 5,
                wrong: Some(0),
            }),
        };
        // The first size is an outlier; 256 B holds the latencies; 1 MiB
        // is not a small message.
        let rows = [
            mk(8, 90.0, 45.0),
            mk(256, 20.0, 16.0),
            mk(1 << 20, 10.0, 5.0),
        ];
        let s = nccl_summary(&rows);
        assert_eq!(s.len(), 4);
        let cells: Vec<&str> = s[3].split('|').map(str::trim).collect();
        // "# ", coll, type, op, largest, bw gc, bw nccl, ratio, peak gc,
        // peak nccl, ratio, lat gc, lat nccl, ratio, geomean.
        assert_eq!(cells[4], "1 MiB");
        assert_eq!(cells[7], "0.500");
        assert_eq!(
            (cells[11], cells[12], cells[13]),
            ("20.00", "16.00", "1.250")
        );
        let geo = (2.0f64 * 1.25 * 2.0).powf(1.0 / 3.0);
        assert_eq!(cells[14], format!("{geo:.3}"));
    }
}
