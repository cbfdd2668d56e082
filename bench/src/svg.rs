//! `--svg FILE`: busbw against size, one panel per collective (and datatype
//! and op), gpucoll and NCCL as one line each. Hand-written SVG 1.1.

use crate::report::{series, Row};
use std::fmt::Write;

const PANEL_W: f64 = 440.0;
const PANEL_H: f64 = 300.0;
const LEFT: f64 = 58.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 46.0;
const TITLE_H: f64 = 40.0;
const GC_COLOR: &str = "#1f77b4";
const NCCL_COLOR: &str = "#d62728";

/// Escape text for XML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Short size label for a power of two: 8, 1K, 64M, 1G.
fn size_label(exp: i32) -> String {
    let b = 1u64 << exp.clamp(0, 62);
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if b >= 1 << shift {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

/// A round upper bound for the y axis and its tick step.
fn nice_max(max: f64) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 0.2);
    }
    let mag = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        let step = m * mag / 5.0;
        if step * 5.0 >= max {
            return (step * 5.0, step);
        }
    }
    (10.0 * mag, 2.0 * mag)
}

/// Points (bytes, busbw GB/s) of one line.
type Line = Vec<(u64, f64)>;

fn lines_of(rows: &[&Row]) -> (Line, Line) {
    let gc = rows
        .iter()
        .filter_map(|r| Some((r.bytes, r.reference()?.busbw)))
        .filter(|(b, y)| *b > 0 && y.is_finite())
        .collect();
    let nccl = rows
        .iter()
        .filter_map(|r| Some((r.bytes, r.nccl.as_ref()?.best()?.busbw)))
        .filter(|(b, y)| *b > 0 && y.is_finite())
        .collect();
    (gc, nccl)
}

fn panel(out: &mut String, x0: f64, y0: f64, title: &str, gc: &Line, nccl: &Line) {
    let (pw, ph) = (PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM);
    let (px, py) = (x0 + LEFT, y0 + TOP);
    let all: Vec<&(u64, f64)> = gc.iter().chain(nccl.iter()).collect();
    let lo = all.iter().map(|p| p.0).min().unwrap_or(1).max(1);
    let hi = all.iter().map(|p| p.0).max().unwrap_or(1).max(lo);
    let xmin = (lo as f64).log2().floor() as i32;
    let xmax = ((hi as f64).log2().ceil() as i32).max(xmin + 1);
    let (ymax, ystep) = nice_max(all.iter().map(|p| p.1).fold(0.0, f64::max));
    let sx = |b: u64| px + ((b as f64).log2() - xmin as f64) / (xmax - xmin) as f64 * pw;
    let sy = |v: f64| py + ph - (v.clamp(0.0, ymax) / ymax) * ph;

    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" class="pt">{}</text>"#,
        x0 + PANEL_W / 2.0,
        y0 + 18.0,
        esc(title)
    );
    // Grid and y ticks.
    let mut v = 0.0;
    while v <= ymax * (1.0 + 1e-9) {
        let y = sy(v);
        let _ = writeln!(
            out,
            r#"<line x1="{px:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" class="grid"/><text x="{:.1}" y="{:.1}" class="yt">{}</text>"#,
            px + pw,
            px - 5.0,
            y + 4.0,
            if ystep >= 1.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        );
        v += ystep;
    }
    // x ticks at every power of two; labels at multiples of 1, 2, 5 or 10
    // (powers of 1024 among them), at most about 8.
    let span = xmax - xmin;
    let every = [1, 2, 5, 10, 20]
        .into_iter()
        .find(|k| span / k <= 8)
        .unwrap_or(20);
    for e in xmin..=xmax {
        let x = px + (e - xmin) as f64 / span as f64 * pw;
        let _ = writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{py:.1}" x2="{x:.1}" y2="{:.1}" class="grid"/>"#,
            py + ph
        );
        if e % every == 0 {
            let _ = writeln!(
                out,
                r#"<text x="{x:.1}" y="{:.1}" class="xt">{}</text>"#,
                py + ph + 15.0,
                size_label(e)
            );
        }
    }
    // Axes and labels.
    let _ = writeln!(
        out,
        r#"<rect x="{px:.1}" y="{py:.1}" width="{pw:.1}" height="{ph:.1}" class="frame"/>"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" class="xl">message size (bytes, log2 scale)</text>"#,
        px + pw / 2.0,
        py + ph + 34.0
    );
    let (lx, ly) = (x0 + 14.0, py + ph / 2.0);
    let _ = writeln!(
        out,
        r#"<text x="{lx:.1}" y="{ly:.1}" class="yl" transform="rotate(-90 {lx:.1} {ly:.1})">busbw (GB/s)</text>"#
    );
    // The lines.
    for (line, color, dash, name) in [
        (gc, GC_COLOR, "", "gpucoll"),
        (nccl, NCCL_COLOR, r#" stroke-dasharray="6 3""#, "NCCL"),
    ] {
        if line.is_empty() {
            continue;
        }
        let pts: Vec<String> = line
            .iter()
            .map(|&(b, y)| format!("{:.1},{:.1}", sx(b), sy(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}><title>{name}</title></polyline>"#,
            pts.join(" ")
        );
        for &(b, y) in line {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"><title>{name} {} B: {y:.2} GB/s</title></circle>"#,
                sx(b),
                sy(y),
                b
            );
        }
    }
    // Legend (top left inside the plot).
    let mut ly = py + 14.0;
    for (color, dash, name, present) in [
        (GC_COLOR, "", "gpucoll", !gc.is_empty()),
        (
            NCCL_COLOR,
            r#" stroke-dasharray="6 3""#,
            "NCCL",
            !nccl.is_empty(),
        ),
    ] {
        if !present {
            continue;
        }
        let lx = px + 10.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}" class="lg">{name}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0
        );
        ly += 16.0;
    }
    if gc.is_empty() && nccl.is_empty() {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" class="pt">no data</text>"#,
            px + pw / 2.0,
            py + ph / 2.0
        );
    }
}

/// The whole SVG document for `rows`, titled `title`.
pub fn plot(rows: &[Row], title: &str) -> String {
    let groups = series(rows);
    let n = groups.len().max(1);
    let cols = n.min(4);
    let nrows = n.div_ceil(cols);
    let (w, h) = (cols as f64 * PANEL_W, TITLE_H + nrows as f64 * PANEL_H);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="Helvetica, Arial, sans-serif">
<style>
.grid {{ stroke: #e0e0e0; stroke-width: 1; }}
.frame {{ fill: none; stroke: #444; stroke-width: 1; }}
.pt {{ font-size: 14px; font-weight: bold; text-anchor: middle; }}
.title {{ font-size: 16px; font-weight: bold; text-anchor: middle; }}
.xt {{ font-size: 10px; text-anchor: middle; fill: #333; }}
.yt {{ font-size: 10px; text-anchor: end; fill: #333; }}
.xl, .yl {{ font-size: 11px; text-anchor: middle; fill: #333; }}
.lg {{ font-size: 11px; fill: #222; }}
</style>
<rect width="100%" height="100%" fill="white"/>
<text x="{:.1}" y="24" class="title">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    if groups.is_empty() {
        panel(
            &mut out,
            0.0,
            TITLE_H,
            "no results",
            &Vec::new(),
            &Vec::new(),
        );
    }
    for (i, g) in groups.iter().enumerate() {
        let (c, r) = (i % cols, i / cols);
        let f = g[0];
        let name = format!("{} ({}, {})", f.coll.name(), f.dtype, f.op);
        let (gc, nccl) = lines_of(g);
        panel(
            &mut out,
            c as f64 * PANEL_W,
            TITLE_H + r as f64 * PANEL_H,
            &name,
            &gc,
            &nccl,
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::Mode;
    use crate::report::{Measure, NcclMeasure};
    use gpucoll::CollKind;

    fn row(coll: CollKind, bytes: u64, gc: f64, nccl: Option<f64>) -> Row {
        Row {
            mode: Mode::Blocking,
            coll,
            dtype: "float",
            op: "sum".into(),
            root: None,
            bytes,
            count: (bytes / 4) as usize,
            out_of_place: Some(Measure {
                in_place: false,
                time_us: 10.0,
                algbw: gc,
                busbw: gc,
                wrong: Some(0),
                iters: 5,
            }),
            in_place: None,
            mpi: None,
            nccl: nccl.map(|b| NcclMeasure::Time {
                time_us: 5.0,
                algbw: b,
                busbw: b,
                async_time_us: Some(4.0),
                sym: None,
                iters: 5,
                wrong: Some(0),
            }),
            registered: None,
        }
    }

    /// Every `<tag` opened is closed (`</tag>` or `/>`): a rough
    /// well-formedness check without an XML parser.
    fn balanced(s: &str) -> bool {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = s;
        while let Some(i) = rest.find('<') {
            rest = &rest[i + 1..];
            let end = match rest.find('>') {
                Some(e) => e,
                None => return false,
            };
            let tag = &rest[..end];
            if tag.starts_with('?') {
            } else if let Some(name) = tag.strip_prefix('/') {
                if stack.pop().as_deref() != Some(name.trim()) {
                    return false;
                }
            } else if !tag.ends_with('/') {
                let name = tag.split_whitespace().next().unwrap_or("");
                stack.push(name.to_string());
            }
            rest = &rest[end + 1..];
        }
        stack.is_empty()
    }

    #[test]
    fn plots_two_collectives() {
        let mut rows = Vec::new();
        for e in 3..=30 {
            rows.push(row(
                CollKind::AllReduce,
                1 << e,
                e as f64,
                Some(2.0 * e as f64),
            ));
            rows.push(row(CollKind::Broadcast, 1 << e, e as f64 / 2.0, None));
        }
        let svg = plot(&rows, "2 ranks <cuda> & NCCL");
        assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
        assert!(balanced(&svg), "unbalanced tags");
        assert!(svg.contains("2 ranks &lt;cuda&gt; &amp; NCCL"));
        assert!(svg.contains("all_reduce (float, sum)") && svg.contains("broadcast (float, sum)"));
        // all_reduce: gpucoll and NCCL lines; broadcast: gpucoll only.
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert!(svg.contains(">1G</text>") && svg.contains("busbw (GB/s)"));
        assert!(svg.contains("stroke-dasharray"));
    }

    #[test]
    fn empty_and_degenerate_inputs() {
        let svg = plot(&[], "nothing");
        assert!(balanced(&svg) && svg.contains("no data"));
        let one = plot(&[row(CollKind::AllGather, 8, 0.0, Some(0.0))], "one");
        assert!(balanced(&one) && !one.contains("NaN") && !one.contains("inf"));
    }

    #[test]
    fn helpers() {
        assert_eq!(size_label(3), "8");
        assert_eq!(size_label(10), "1K");
        assert_eq!(size_label(26), "64M");
        assert_eq!(size_label(30), "1G");
        assert_eq!(nice_max(0.0), (1.0, 0.2));
        let (m, s) = nice_max(331.0);
        assert!(m >= 331.0 && (m / s - 5.0).abs() < 1e-9);
        assert_eq!(esc("a<b&\"c\">"), "a&lt;b&amp;&quot;c&quot;&gt;");
    }
}
