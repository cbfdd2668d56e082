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

/// The three header lines for a table.
pub fn header(show_oop: bool, show_ip: bool, vs_mpi: bool) -> String {
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
    format!("{}\n{}\n{}", l1.trim_end(), l2, l3)
}

impl Row {
    /// The gpucoll time the MPI ratio compares against.
    fn reference_time(&self) -> Option<f64> {
        self.out_of_place
            .as_ref()
            .or(self.in_place.as_ref())
            .map(|m| m.time_us)
    }

    /// mpi_time / gpucoll_time (> 1: gpucoll is faster).
    pub fn ratio(&self) -> Option<f64> {
        match (&self.mpi, self.reference_time()) {
            (Some(MpiMeasure::Time(t)), Some(g)) if g > 0.0 => Some(t / g),
            _ => None,
        }
    }

    pub fn format(&self, show_oop: bool, show_ip: bool, vs_mpi: bool) -> String {
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
            out.push(format!("{{{}}}", fields.join(",")));
        }
        out
    }
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
        };
        assert_eq!(row.ratio(), Some(2.0));
        let line = row.format(true, true, true);
        assert!(line.contains("12.50") && line.contains("2.00") && line.contains("  -1"));
        let js = row.json_objects(4, 1, "host");
        assert_eq!(js.len(), 2);
        assert!(js[0].starts_with("{\"collective\":\"all_reduce\""));
        assert!(js[1].contains("\"in_place\":true"));
        assert!(js[0].contains("\"mpi_ratio\":2"));
        assert_eq!(json_str("a\"b"), "\"a\\\"b\"");
        assert_eq!(json_num(f64::NAN), "null");
    }
}
