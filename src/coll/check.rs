//! Argument checks: everything a single rank can see is wrong is reported
//! here, before any data moves, and leaves the communicator usable.
//!
//! In-place calls are mapped to MPI's `MPI_IN_PLACE` layouts here (an
//! in-place all_gather's input is the rank's own block of the buffer).

use crate::buffer::{MemoryKind, RawBuffer};
use crate::engine::Call;
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::task::{CollKind, Task};

/// The buffers of a call as the user passed them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Args {
    /// Separate send and receive buffers (either may be absent where the
    /// collective has none on this rank, e.g. `reduce` off-root).
    Separate {
        send: Option<RawBuffer>,
        recv: Option<RawBuffer>,
    },
    /// One buffer used in place.
    InPlace(RawBuffer),
}

fn len_err(buffer: &'static str, expected: u64, actual: u64) -> Error {
    Error::BufferLength {
        buffer,
        expected,
        actual,
    }
}

fn div(buffer: &'static str, len: u64, size: usize) -> Result<u64> {
    if len % size as u64 != 0 {
        return Err(Error::NotDivisible { buffer, len, size });
    }
    Ok(len / size as u64)
}

fn times(count: u64, size: usize) -> Result<u64> {
    count
        .checked_mul(size as u64)
        .ok_or(Error::CountTooLarge(count))
}

fn sub(buf: RawBuffer, offset_elems: u64, len: u64) -> RawBuffer {
    RawBuffer {
        addr: buf.addr + offset_elems * buf.dtype.size() as u64,
        len,
        ..buf
    }
}

fn check_bytes(b: &RawBuffer) -> Result<()> {
    let bytes = b
        .len
        .checked_mul(b.dtype.size() as u64)
        .ok_or(Error::CountTooLarge(b.len))?;
    if bytes > i64::MAX as u64 || b.addr.checked_add(bytes).is_none() {
        return Err(Error::CountTooLarge(b.len));
    }
    Ok(())
}

/// Validate a call on `rank` of `size` ranks and produce the engine's view.
/// `memory_ok` tells whether the backend can use a buffer's memory.
pub(crate) fn prepare(
    kind: CollKind,
    args: Args,
    op: ReduceOp,
    root: usize,
    rank: usize,
    size: usize,
    memory_ok: &dyn Fn(MemoryKind) -> Result<()>,
) -> Result<Call> {
    if kind.rooted() && root >= size {
        return Err(Error::InvalidRoot { root, size });
    }
    let is_root = root == rank;
    let dtype = match args {
        Args::InPlace(b) => b.dtype,
        Args::Separate { send, recv } => match (send, recv) {
            (Some(s), Some(r)) => {
                if s.dtype != r.dtype {
                    return Err(Error::TypeMismatch {
                        send: s.dtype,
                        recv: r.dtype,
                    });
                }
                if s.overlaps(&r) {
                    return Err(Error::Aliasing);
                }
                s.dtype
            }
            (Some(s), None) => s.dtype,
            (None, Some(r)) => r.dtype,
            (None, None) => return Err(Error::InvalidUsage("a collective needs a buffer".into())),
        },
    };
    for b in match args {
        Args::InPlace(b) => [Some(b), None],
        Args::Separate { send, recv } => [send, recv],
    }
    .into_iter()
    .flatten()
    {
        check_bytes(&b)?;
        memory_ok(b.memory)?;
    }
    let op = if kind.reduces() {
        op.validate(dtype)?;
        if kind.is_scan() && op == ReduceOp::Avg {
            // Rank r's prefix averages r+1 inputs, but Avg divides by the
            // communicator's size (MPI has no averaging op either).
            return Err(Error::InvalidOp {
                op: format!(
                    "{op} (a {} averages a different number of ranks on each rank; use Sum)",
                    kind.name()
                ),
                dtype,
            });
        }
        op
    } else {
        ReduceOp::Sum
    };
    let task = |count: u64, in_place: bool| Task {
        kind,
        dtype,
        op,
        count,
        root: if kind.rooted() { root } else { 0 },
        in_place,
    };
    let empty_at = |b: RawBuffer| RawBuffer { len: 0, ..b };
    let call = |task: Task, input: RawBuffer, output: RawBuffer| Call {
        task,
        input,
        output,
    };
    let need = |what: &'static str, b: Option<RawBuffer>| {
        b.ok_or_else(|| Error::InvalidUsage(format!("{} needs a {what} buffer", kind.name())))
    };

    match (kind, args) {
        // MPI: rank 0's receive buffer of an exclusive scan is not
        // significant; gpucoll never writes it, so it may be absent.
        (CollKind::ExclusiveScan, Args::Separate { send, recv: None }) if rank == 0 => {
            let s = need("send", send)?;
            Ok(call(task(s.len, false), s, empty_at(s)))
        }
        (
            CollKind::AllReduce | CollKind::Scan | CollKind::ExclusiveScan,
            Args::Separate { send, recv },
        ) => {
            let (s, r) = (need("send", send)?, need("receive", recv)?);
            if r.len != s.len {
                return Err(len_err("receive", s.len, r.len));
            }
            Ok(call(task(s.len, false), s, r))
        }
        // In place, a scan's input is the receive buffer and its result
        // replaces it (MPI_IN_PLACE); exclusive_scan leaves rank 0's as is.
        (
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Scan | CollKind::ExclusiveScan,
            Args::InPlace(b),
        ) => Ok(call(task(b.len, true), b, b)),
        (CollKind::Broadcast, Args::Separate { .. }) => {
            Err(Error::InvalidUsage("broadcast takes one buffer".into()))
        }
        (CollKind::Reduce, Args::Separate { send, recv }) => {
            let s = need("send", send)?;
            if is_root {
                let r = need("receive", recv)?;
                if r.len != s.len {
                    return Err(len_err("receive", s.len, r.len));
                }
                Ok(call(task(s.len, false), s, r))
            } else {
                Ok(call(task(s.len, false), s, empty_at(s)))
            }
        }
        (CollKind::Reduce, Args::InPlace(b)) => {
            if !is_root {
                return Err(Error::InPlace(
                    "only the root may reduce in place; other ranks call reduce_into".into(),
                ));
            }
            Ok(call(task(b.len, true), b, b))
        }
        (CollKind::AllGather, Args::Separate { send, recv }) => {
            let (s, r) = (need("send", send)?, need("receive", recv)?);
            let want = times(s.len, size)?;
            if r.len != want {
                return Err(len_err("receive", want, r.len));
            }
            Ok(call(task(s.len, false), s, r))
        }
        (CollKind::AllGather, Args::InPlace(b)) => {
            let count = div("in-place", b.len, size)?;
            Ok(call(
                task(count, true),
                sub(b, rank as u64 * count, count),
                b,
            ))
        }
        (CollKind::ReduceScatter, Args::Separate { send, recv }) => {
            let (s, r) = (need("send", send)?, need("receive", recv)?);
            let count = div("send", s.len, size)?;
            if r.len != count {
                return Err(len_err("receive", count, r.len));
            }
            Ok(call(task(count, false), s, r))
        }
        (CollKind::ReduceScatter, Args::InPlace(b)) => {
            let count = div("in-place", b.len, size)?;
            Ok(call(task(count, true), b, b))
        }
        (CollKind::AllToAll, Args::Separate { send, recv }) => {
            let (s, r) = (need("send", send)?, need("receive", recv)?);
            let count = div("send", s.len, size)?;
            if r.len != s.len {
                return Err(len_err("receive", s.len, r.len));
            }
            Ok(call(task(count, false), s, r))
        }
        (CollKind::AllToAll, Args::InPlace(b)) => {
            let count = div("in-place", b.len, size)?;
            Ok(call(task(count, true), b, b))
        }
        (CollKind::Gather, Args::Separate { send, recv }) => {
            let s = need("send", send)?;
            if is_root {
                let r = need("receive", recv)?;
                let want = times(s.len, size)?;
                if r.len != want {
                    return Err(len_err("receive", want, r.len));
                }
                Ok(call(task(s.len, false), s, r))
            } else {
                Ok(call(task(s.len, false), s, empty_at(s)))
            }
        }
        (CollKind::Gather, Args::InPlace(b)) => {
            if !is_root {
                return Err(Error::InPlace(
                    "only the root may gather in place; other ranks call gather_into".into(),
                ));
            }
            let count = div("in-place", b.len, size)?;
            Ok(call(
                task(count, true),
                sub(b, root as u64 * count, count),
                b,
            ))
        }
        (CollKind::Scatter, Args::Separate { send, recv }) => {
            let r = need("receive", recv)?;
            if is_root {
                let s = need("send", send)?;
                let count = div("send", s.len, size)?;
                if r.len != count {
                    return Err(len_err("receive", count, r.len));
                }
                Ok(call(task(count, false), s, r))
            } else {
                Ok(call(task(r.len, false), empty_at(r), r))
            }
        }
        (CollKind::Scatter, Args::InPlace(b)) => {
            if !is_root {
                return Err(Error::InPlace(
                    "only the root may scatter in place; other ranks call scatter_into".into(),
                ));
            }
            let count = div("in-place", b.len, size)?;
            Ok(call(
                task(count, true),
                b,
                sub(b, root as u64 * count, count),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::Buffer;

    fn ok(_: MemoryKind) -> Result<()> {
        Ok(())
    }

    #[test]
    fn root_out_of_range() {
        let v = vec![0f32; 4];
        let e = prepare(
            CollKind::Broadcast,
            Args::InPlace(v.raw()),
            ReduceOp::Sum,
            4,
            0,
            4,
            &ok,
        )
        .unwrap_err();
        assert_eq!(e, Error::InvalidRoot { root: 4, size: 4 });
    }

    #[test]
    fn short_receive_buffer() {
        let s = vec![0f32; 8];
        let r = vec![0f32; 7];
        let e = prepare(
            CollKind::AllReduce,
            Args::Separate {
                send: Some(s.raw()),
                recv: Some(r.raw()),
            },
            ReduceOp::Sum,
            0,
            0,
            2,
            &ok,
        )
        .unwrap_err();
        assert!(matches!(
            e,
            Error::BufferLength {
                expected: 8,
                actual: 7,
                ..
            }
        ));
    }

    #[test]
    fn type_mismatch_and_alias() {
        let s = vec![0f32; 8];
        let r = vec![0i32; 8];
        let e = prepare(
            CollKind::AllReduce,
            Args::Separate {
                send: Some(s.raw()),
                recv: Some(r.raw()),
            },
            ReduceOp::Sum,
            0,
            0,
            2,
            &ok,
        )
        .unwrap_err();
        assert!(matches!(e, Error::TypeMismatch { .. }));
        let a = s.raw();
        let e = prepare(
            CollKind::AllReduce,
            Args::Separate {
                send: Some(a),
                recv: Some(a),
            },
            ReduceOp::Sum,
            0,
            0,
            2,
            &ok,
        )
        .unwrap_err();
        assert_eq!(e, Error::Aliasing);
    }

    #[test]
    fn in_place_all_gather_binds_own_block() {
        let v = vec![0u64; 12];
        let c = prepare(
            CollKind::AllGather,
            Args::InPlace(v.raw()),
            ReduceOp::Sum,
            0,
            2,
            3,
            &ok,
        )
        .unwrap();
        assert_eq!(c.task.count, 4);
        assert_eq!(c.input.addr, v.raw().addr + 2 * 4 * 8);
        assert_eq!(c.output, v.raw());
    }

    #[test]
    fn not_divisible() {
        let s = vec![0u8; 7];
        let r = vec![0u8; 3];
        let e = prepare(
            CollKind::ReduceScatter,
            Args::Separate {
                send: Some(s.raw()),
                recv: Some(r.raw()),
            },
            ReduceOp::Sum,
            0,
            0,
            2,
            &ok,
        )
        .unwrap_err();
        assert!(matches!(
            e,
            Error::NotDivisible {
                len: 7,
                size: 2,
                ..
            }
        ));
    }

    #[test]
    fn scans_take_reductions_but_not_avg() {
        let (s, r) = (vec![0i32; 5], vec![0i32; 5]);
        let args = Args::Separate {
            send: Some(s.raw()),
            recv: Some(r.raw()),
        };
        for kind in [CollKind::Scan, CollKind::ExclusiveScan] {
            for op in ReduceOp::ALL {
                let res = prepare(kind, args, op, 0, 1, 3, &ok);
                match op {
                    ReduceOp::Avg => assert!(
                        matches!(&res, Err(Error::InvalidOp { op, .. }) if op.contains(kind.name())),
                        "{res:?}"
                    ),
                    _ => assert_eq!(res.unwrap().task.count, 5, "{op}"),
                }
            }
            let short = vec![0i32; 4];
            let e = prepare(
                kind,
                Args::Separate {
                    send: Some(s.raw()),
                    recv: Some(short.raw()),
                },
                ReduceOp::Sum,
                0,
                0,
                2,
                &ok,
            )
            .unwrap_err();
            assert!(matches!(
                e,
                Error::BufferLength {
                    expected: 5,
                    actual: 4,
                    ..
                }
            ));
            // Rank 0 of an exclusive scan may omit its receive buffer.
            let send_only = Args::Separate {
                send: Some(s.raw()),
                recv: None,
            };
            let res = prepare(kind, send_only, ReduceOp::Sum, 0, 0, 2, &ok);
            if kind == CollKind::ExclusiveScan {
                let c = res.unwrap();
                assert_eq!((c.task.count, c.output.len), (5, 0));
                assert!(prepare(kind, send_only, ReduceOp::Sum, 0, 1, 2, &ok).is_err());
            } else {
                assert!(matches!(res, Err(Error::InvalidUsage(_))));
            }
            let c = prepare(kind, Args::InPlace(r.raw()), ReduceOp::Max, 0, 0, 2, &ok).unwrap();
            assert!(c.task.in_place && c.task.count == 5 && c.input == c.output);
            assert!(matches!(
                prepare(kind, args, ReduceOp::BitAnd, 0, 0, 2, &|_| Ok(())).map(|c| c.task.op),
                Ok(ReduceOp::BitAnd)
            ));
        }
        let f = vec![0f32; 5];
        assert!(matches!(
            prepare(
                CollKind::Scan,
                Args::InPlace(f.raw()),
                ReduceOp::BitOr,
                0,
                0,
                2,
                &ok
            ),
            Err(Error::InvalidOp { .. })
        ));
    }

    #[test]
    fn off_root_in_place_rejected() {
        let v = vec![0f64; 4];
        let e = prepare(
            CollKind::Reduce,
            Args::InPlace(v.raw()),
            ReduceOp::Sum,
            0,
            1,
            2,
            &ok,
        )
        .unwrap_err();
        assert!(matches!(e, Error::InPlace(_)));
    }
}
