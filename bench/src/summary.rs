//! The per-mode summary table of gpucoll against NCCL (end of the text
//! output, copied into gpu-check's summary.md).

use crate::args::Mode;
use crate::report::{fmt_bytes, series, Measure, Row};
/// Sizes up to this count as small messages in the summary's latency.
pub const LATENCY_MAX_BYTES: u64 = 1024;

/// A Markdown table (each line prefixed with `# `) of gpucoll against NCCL
/// per collective: busbw at the largest size, peak busbw, small-message
/// latency (the smallest mean time over sizes up to 1 KiB, or at the
/// smallest size), and the geometric mean of the time ratio over all sizes.
/// Empty when no row has NCCL figures.
pub fn nccl_summary(rows: &[Row], mode: Mode) -> Vec<String> {
    let rows: Vec<Row> = rows.iter().filter(|r| r.mode == mode).cloned().collect();
    if !rows.iter().any(|r| r.nccl.is_some()) {
        return Vec::new();
    }
    let how = match mode {
        Mode::Blocking => "blocking calls",
        Mode::Async => "calls queued on one stream, one synchronize",
        Mode::Graph => "calls captured into a CUDA graph, replayed",
    };
    // --register: gpucoll's rows ran on registered buffers.
    let registered = if rows.iter().any(|r| r.registered.is_some()) {
        " on registered buffers (--register)"
    } else {
        ""
    };
    let mut out = vec![
        format!(
            "# gpucoll vs NCCL, mode {} ({how}; gc = gpucoll{registered} out-of-place, in-place \
             for broadcast; NCCL = best of ordinary and symmetric-window buffers per size; ratios \
             gc/nccl: busbw ratio < 1 and time ratio > 1 mean NCCL is faster; latency = \
             smallest mean time over sizes <= 1 KiB)",
            mode.name()
        ),
        "# | collective | type | op | largest | busbw gc | busbw nccl | ratio | peak gc | \
         peak nccl | ratio | latency gc (us) | latency nccl (us) | ratio | time ratio \
         geomean |"
            .to_string(),
        "# |---|---|---|---|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for s in series(&rows) {
        let f = s[0];
        let both: Vec<(&Row, &Measure, f64, f64)> = s
            .iter()
            .filter_map(|r| {
                let best = r.nccl.as_ref()?.best()?;
                Some((*r, r.reference()?, best.time_us, best.busbw))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{nccl_row, sample_row};
    use crate::report::NcclMeasure;
    use gpucoll::CollKind;

    #[test]
    fn summary_per_mode_against_nccl_best() {
        let rows = [
            nccl_row(Mode::Blocking, 16.0, None),
            nccl_row(Mode::Graph, 10.0, Some(4.0)),
        ];
        let g = nccl_summary(&rows, Mode::Graph);
        assert_eq!(g.len(), 4);
        assert!(g[0].contains("mode graph"));
        let cells: Vec<&str> = g[3].split('|').map(str::trim).collect();
        // latency gc 8 us vs NCCL best 4 us.
        assert_eq!((cells[11], cells[12], cells[13]), ("8.00", "4.00", "2.000"));
        let b = nccl_summary(&rows, Mode::Blocking);
        let cells: Vec<&str> = b[3].split('|').map(str::trim).collect();
        assert_eq!((cells[12], cells[13]), ("16.00", "0.500"));
        assert!(nccl_summary(&rows, Mode::Async).is_empty());
    }

    #[test]
    fn one_row_and_an_unsupported_nccl() {
        let row = sample_row();
        let sum = nccl_summary(std::slice::from_ref(&row), Mode::Blocking);
        assert_eq!(sum.len(), 4);
        assert!(sum[3].starts_with("# | all_reduce | float | sum | 1 KiB | 0.15 | 0.30 | 0.500"));
        let mut un = row;
        un.nccl = Some(NcclMeasure::Unsupported);
        assert!(nccl_summary(&[un], Mode::Blocking)[3].contains("n/a"));
    }

    #[test]
    fn nccl_summary_uses_small_sizes_for_latency() {
        let mk = |bytes: u64, gc_us: f64, nccl_us: f64| Row {
            mode: Mode::Blocking,
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
                async_time_us: Some(nccl_us),
                sym: None,
                iters: 5,
                wrong: Some(0),
            }),
            registered: None,
        };
        // The first size is an outlier; 256 B holds the latencies; 1 MiB
        // is not a small message.
        let rows = [
            mk(8, 90.0, 45.0),
            mk(256, 20.0, 16.0),
            mk(1 << 20, 10.0, 5.0),
        ];
        let s = nccl_summary(&rows, Mode::Blocking);
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
        assert!(s[0].contains("(blocking calls; gc = gpucoll out-of-place"));
        // --register is named in the title, whose mode stays its own word.
        let reg: Vec<Row> = rows
            .iter()
            .cloned()
            .map(|mut r| {
                r.registered = Some(crate::report::Registered {
                    out_of_place_direct: Some(true),
                    in_place_direct: None,
                });
                r
            })
            .collect();
        let s = nccl_summary(&reg, Mode::Blocking);
        assert!(
            s[0].starts_with("# gpucoll vs NCCL, mode blocking ("),
            "{}",
            s[0]
        );
        assert!(s[0].contains("gc = gpucoll on registered buffers (--register) out-of-place"));
        assert_eq!(s[3], nccl_summary(&rows, Mode::Blocking)[3]);
    }
}
