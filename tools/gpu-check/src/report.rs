//! The end of a run: every rank's failure count and log gathered at rank 0,
//! the summary printed there (and written to `--out`), the exit status.

use gpucoll::mpi::MpiComm;
use std::fmt::Write as _;

/// Gather every rank's failure count and log at rank 0, print the
/// summary there (and write it to `out`); the exit status.
pub(crate) fn report(
    mpi: &MpiComm,
    rank: usize,
    n: usize,
    failures: usize,
    log: &str,
    header: &str,
    out: Option<String>,
) -> i32 {
    let mine = format!("{failures}\n{log}");
    let lens = (mine.len() as u64).to_le_bytes().to_vec();
    let all_lens = mpi.allgather_bytes(&lens).unwrap_or_default();
    let maxlen = all_lens
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .max()
        .unwrap_or(0) as usize;
    let mut padded = mine.into_bytes();
    padded.resize(maxlen, b' ');
    let all = mpi.allgather_bytes(&padded).unwrap_or_default();
    let mut total_fail = 0usize;
    let mut summary = String::new();
    let _ = writeln!(summary, "{header}");
    for r in 0..n {
        let chunk = all.get(r * maxlen..(r + 1) * maxlen).unwrap_or(&[]);
        let text = String::from_utf8_lossy(chunk);
        let text = text.trim_end();
        let (f, rest) = text.split_once('\n').unwrap_or((text, ""));
        total_fail += f.trim().parse::<usize>().unwrap_or(1);
        for line in rest.lines().take(80) {
            let _ = writeln!(summary, "{line}");
        }
    }
    let _ = writeln!(
        summary,
        "gpu_check: {}",
        if total_fail == 0 {
            "ALL PASSED".to_string()
        } else {
            format!("{total_fail} FAILURES")
        }
    );
    if rank == 0 {
        print!("{summary}");
        if let Some(p) = out {
            let _ = std::fs::write(p, &summary);
        }
    }
    if total_fail == 0 {
        0
    } else {
        1
    }
}
