//! Deterministic inputs and exact expected outputs.
//!
//! Every rank can compute every rank's input from `(rank, index)`, so each
//! rank checks its own output without extra communication. Inputs are small
//! integers: sums, minima, maxima and products of them (products of values in
//! {-1, 1, 2}) are exact in every datatype, integer results follow the
//! library's wrapping arithmetic, and only `avg` and `premulsum` on floating
//! types (which scale in floating point) are compared with a tolerance.

use gpucoll::{bf16, f16, CollKind, Equivalence, ReduceOp};

/// An element type the bench can fill and check.
pub trait Elem: Equivalence + Copy + PartialEq + Default + std::fmt::Debug + Send + Sync {
    /// Exactly representable small integers (`from_int` of values in
    /// `0..EXACT_LIMIT` is exact).
    const EXACT_LIMIT: i64;
    fn from_int(v: i64) -> Self;
    /// Integer types: the value as i128 (two's complement reading).
    fn to_i128(self) -> i128;
    /// Integer types: truncate (wrap) an i128 into the type.
    fn wrap_i128(v: i128) -> Self;
    fn to_f64(self) -> f64;
    /// Round to nearest (floats); integers convert with `as` (saturating).
    fn from_f64(v: f64) -> Self;
    /// Unit roundoff of the type (0 for integers).
    const EPS: f64;
}

macro_rules! int_elem {
    ($($t:ty => $lim:expr),*) => {$(
        impl Elem for $t {
            const EXACT_LIMIT: i64 = $lim;
            const EPS: f64 = 0.0;
            fn from_int(v: i64) -> Self { v as $t }
            fn to_i128(self) -> i128 { self as i128 }
            fn wrap_i128(v: i128) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self { v as $t }
        }
    )*};
}

int_elem! {
    i8 => 127, u8 => 255, i32 => 1 << 20, u32 => 1 << 20, i64 => 1 << 40, u64 => 1 << 40
}

impl Elem for f32 {
    const EXACT_LIMIT: i64 = 1 << 24;
    const EPS: f64 = f32::EPSILON as f64 / 2.0;
    fn from_int(v: i64) -> Self {
        v as f32
    }
    fn to_i128(self) -> i128 {
        self as i128
    }
    fn wrap_i128(v: i128) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Elem for f64 {
    const EXACT_LIMIT: i64 = 1 << 40;
    const EPS: f64 = f64::EPSILON / 2.0;
    fn from_int(v: i64) -> Self {
        v as f64
    }
    fn to_i128(self) -> i128 {
        self as i128
    }
    fn wrap_i128(v: i128) -> Self {
        v as f64
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

impl Elem for f16 {
    const EXACT_LIMIT: i64 = 2048;
    const EPS: f64 = 1.0 / 2048.0;
    fn from_int(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn to_i128(self) -> i128 {
        self.to_f64() as i128
    }
    fn wrap_i128(v: i128) -> Self {
        f16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

impl Elem for bf16 {
    const EXACT_LIMIT: i64 = 256;
    const EPS: f64 = 1.0 / 256.0;
    fn from_int(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn to_i128(self) -> i128 {
        self.to_f64() as i128
    }
    fn wrap_i128(v: i128) -> Self {
        bf16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

/// What one rank's buffers must look like for one call.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub kind: CollKind,
    pub op: ReduceOp,
    /// Per-rank block (NCCL's count; see `gpucoll::task::Task`).
    pub count: usize,
    pub nranks: usize,
    pub rank: usize,
    pub root: usize,
}

impl Case {
    /// A table's call of `count` elements on `rank` of `nranks`: `op` (sum
    /// for collectives that do not reduce, which ignore it) and `--root`
    /// for rooted collectives.
    pub fn of_table(
        kind: CollKind,
        op: Option<ReduceOp>,
        count: usize,
        (rank, nranks): (usize, usize),
        root: usize,
    ) -> Case {
        Case {
            kind,
            op: op.unwrap_or(ReduceOp::Sum),
            count,
            nranks,
            rank,
            root: if kind.rooted() { root } else { 0 },
        }
    }

    pub fn is_root(&self) -> bool {
        self.rank == self.root
    }

    /// Elements of the out-of-place input buffer on this rank.
    pub fn input_len(&self) -> usize {
        let (c, n) = (self.count, self.nranks);
        match self.kind {
            CollKind::ReduceScatter | CollKind::AllToAll => c * n,
            CollKind::Scatter if self.is_root() => c * n,
            CollKind::Scatter => 0,
            _ => c,
        }
    }

    /// Elements of the out-of-place output buffer on this rank.
    pub fn output_len(&self) -> usize {
        let (c, n) = (self.count, self.nranks);
        match self.kind {
            CollKind::AllGather | CollKind::AllToAll => c * n,
            CollKind::Gather if self.is_root() => c * n,
            CollKind::Gather | CollKind::Reduce if !self.is_root() => 0,
            _ => c,
        }
    }

    /// Whether this rank calls the in-place form in an in-place run. Reduce,
    /// gather and scatter are in place only at the root; the other ranks
    /// pass their one buffer as usual (MPI_IN_PLACE rules).
    pub fn rank_in_place(&self) -> bool {
        match self.kind {
            CollKind::Reduce | CollKind::Gather | CollKind::Scatter => self.is_root(),
            _ => true,
        }
    }

    /// Elements of the single buffer of an in-place run on this rank (for
    /// ranks that are not in place there: their one buffer).
    pub fn in_place_len(&self) -> usize {
        let (c, n) = (self.count, self.nranks);
        match self.kind {
            CollKind::AllReduce
            | CollKind::Broadcast
            | CollKind::Reduce
            | CollKind::Scan
            | CollKind::ExclusiveScan => c,
            CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => c * n,
            CollKind::Gather | CollKind::Scatter if self.is_root() => c * n,
            CollKind::Gather | CollKind::Scatter => c,
        }
    }

    fn signed<T: Elem>() -> bool {
        T::DATATYPE.is_signed_int() || T::DATATYPE.is_float()
    }

    /// Element `j` of rank `r`'s out-of-place input.
    pub fn input<T: Elem>(&self, r: usize, j: usize) -> T {
        T::from_int(self.input_int::<T>(r, j))
    }

    fn input_int<T: Elem>(&self, r: usize, j: usize) -> i64 {
        let (r, j) = (r as i64, j as i64);
        if !self.kind.reduces() {
            // Distinct-looking values, so a misplaced block is caught.
            return (r * 1009 + j * 7 + 1) % (T::EXACT_LIMIT - 1);
        }
        match self.op {
            // Products stay exact: at most a few factors of 2 and -1.
            ReduceOp::Prod => match (r + 3 * j) % 11 {
                0 => 2,
                5 if Self::signed::<T>() => -1,
                _ => 1,
            },
            // Logical ops: zeros often enough that every result occurs.
            ReduceOp::LogicalAnd | ReduceOp::LogicalOr | ReduceOp::LogicalXor => {
                if (r + 2 * j) % 5 < 2 {
                    0
                } else {
                    (r * 5 + j * 3 + 1) % 7 + 1
                }
            }
            _ => {
                let v = (r * 5 + j * 3 + 1) % 7;
                if Self::signed::<T>() {
                    v - 3
                } else {
                    v
                }
            }
        }
    }

    /// A value no correct output holds where it is checked (well, rarely).
    pub fn poison<T: Elem>() -> T {
        T::from_int(if T::DATATYPE.is_signed_int() || T::DATATYPE.is_float() {
            -101
        } else {
            113
        })
    }

    /// The reduction over all ranks of input element `j`, and the tolerance
    /// (absolute) allowed for it.
    fn reduced<T: Elem>(&self, j: usize) -> (T, f64) {
        self.reduced_upto(j, self.nranks)
    }

    /// The reduction of input element `j` over ranks `0..n` (a prefix for
    /// scan and exclusive_scan), and its tolerance. Avg divides by the
    /// communicator's size (scans refuse it).
    fn reduced_upto<T: Elem>(&self, j: usize, n: usize) -> (T, f64) {
        let size = self.nranks;
        if T::DATATYPE.is_float() {
            let xs = (0..n).map(|r| self.input::<T>(r, j).to_f64());
            let scale = match self.op {
                ReduceOp::Avg => 1.0 / size as f64,
                ReduceOp::PreMulSum(s) => s,
                _ => 1.0,
            };
            let (v, mag) = match self.op {
                ReduceOp::Prod => (xs.product::<f64>(), 0.0),
                ReduceOp::Min => (xs.fold(f64::INFINITY, f64::min), 0.0),
                ReduceOp::Max => (xs.fold(f64::NEG_INFINITY, f64::max), 0.0),
                ReduceOp::Sum => (xs.sum::<f64>(), 0.0),
                ReduceOp::Avg | ReduceOp::PreMulSum(_) => {
                    let v: Vec<f64> = xs.map(|x| x * scale).collect();
                    (v.iter().sum(), v.iter().map(|x| x.abs()).sum::<f64>())
                }
                // Integer-only ops never run on floats (main skips them):
                // no value matches NaN.
                _ => (f64::NAN, 0.0),
            };
            let tol = if matches!(self.op, ReduceOp::Avg | ReduceOp::PreMulSum(_)) {
                // Scaling rounds each term, summing rounds each partial sum,
                // and the result rounds into T.
                2.0 * (n as f64 + 2.0) * T::EPS * mag.max(v.abs()).max(T::EPS)
            } else {
                0.0
            };
            (T::from_f64(v), tol)
        } else {
            let xs = (0..n).map(|r| self.input::<T>(r, j).to_i128());
            let v: i128 = match self.op {
                ReduceOp::Sum => xs.fold(0i128, i128::wrapping_add),
                ReduceOp::Prod => xs.fold(1i128, i128::wrapping_mul),
                ReduceOp::Min => xs.min().unwrap_or(0),
                ReduceOp::Max => xs.max().unwrap_or(0),
                ReduceOp::Avg => {
                    // Wrapping sum in T, then truncating division.
                    let s = T::wrap_i128(xs.fold(0i128, i128::wrapping_add)).to_i128();
                    s / size as i128
                }
                ReduceOp::PreMulSum(s) => {
                    let k = T::from_f64(s).to_i128();
                    xs.fold(0i128, |acc, x| acc.wrapping_add(x.wrapping_mul(k)))
                }
                // One rank: MPI and gpucoll return the input as it is.
                _ if n == 1 => xs.sum(),
                ReduceOp::BitAnd => xs.fold(-1i128, |a, x| a & x),
                ReduceOp::BitOr => xs.fold(0i128, |a, x| a | x),
                ReduceOp::BitXor => xs.fold(0i128, |a, x| a ^ x),
                ReduceOp::LogicalAnd => xs.fold(1, |a, x| a & (x != 0) as i128),
                ReduceOp::LogicalOr => xs.fold(0, |a, x| a | (x != 0) as i128),
                ReduceOp::LogicalXor => xs.fold(0, |a, x| a ^ (x != 0) as i128),
            };
            (T::wrap_i128(v), 0.0)
        }
    }

    /// Expected element `k` of the (out-of-place layout) output, with the
    /// tolerance allowed. Rank 0 of exclusive_scan has no prefix: its
    /// output must keep the poison it was given (in place: see
    /// [`check_in_place`](Self::check_in_place)).
    pub fn expected<T: Elem>(&self, k: usize) -> (T, f64) {
        let (c, rank, root) = (self.count, self.rank, self.root);
        match self.kind {
            CollKind::Scan => self.reduced_upto(k, rank + 1),
            CollKind::ExclusiveScan if rank == 0 => (Self::poison(), 0.0),
            CollKind::ExclusiveScan => self.reduced_upto(k, rank),
            CollKind::AllReduce | CollKind::Reduce => self.reduced(k),
            CollKind::ReduceScatter => self.reduced(rank * c + k),
            CollKind::Broadcast => (self.input(root, k), 0.0),
            CollKind::AllGather | CollKind::Gather => (self.input(k / c, k % c), 0.0),
            CollKind::AllToAll => (self.input(k / c, rank * c + k % c), 0.0),
            CollKind::Scatter => (self.input(root, rank * c + k), 0.0),
        }
    }

    /// Fill the out-of-place input of this rank.
    pub fn fill_input<T: Elem>(&self, buf: &mut [T]) {
        crate::par::fill(buf, |j| self.input(self.rank, j));
    }

    /// Fill the single buffer of an in-place run as MPI_IN_PLACE lays it out.
    pub fn fill_in_place<T: Elem>(&self, buf: &mut [T]) {
        crate::par::fill(buf, |j| self.in_place_value(j));
    }

    /// Element `j` of the single buffer of an in-place run before the call.
    fn in_place_value<T: Elem>(&self, j: usize) -> T {
        let (c, rank, root) = (self.count, self.rank, self.root);
        let poison = Self::poison::<T>();
        if !self.rank_in_place() {
            // Non-root reduce/gather: the send buffer; scatter: the receive buffer.
            return match self.kind {
                CollKind::Scatter => poison,
                _ => self.input(rank, j),
            };
        }
        match self.kind {
            CollKind::AllReduce
            | CollKind::Reduce
            | CollKind::ReduceScatter
            | CollKind::AllToAll
            | CollKind::Scan
            | CollKind::ExclusiveScan => self.input(rank, j),
            CollKind::Broadcast if rank == root => self.input(rank, j),
            CollKind::Broadcast => poison,
            CollKind::AllGather | CollKind::Gather => {
                let me = if self.kind == CollKind::Gather {
                    root
                } else {
                    rank
                };
                if c > 0 && j / c == me {
                    self.input(me, j % c)
                } else {
                    poison
                }
            }
            CollKind::Scatter => self.input(root, j),
        }
    }

    /// Count the wrong elements of an out-of-place output.
    pub fn check_output<T: Elem>(&self, out: &[T]) -> u64 {
        let len = self.output_len().min(out.len());
        let missing = (self.output_len() - len) as u64;
        missing + crate::par::count_bad(0..len, |k| self.ok(out[k], k))
    }

    /// Count the wrong elements of an in-place run's buffer. Reduce-scatter
    /// leaves its result in the first `count` elements (MPI_IN_PLACE); a
    /// scatter root must find its buffer unchanged.
    pub fn check_in_place<T: Elem>(&self, buf: &[T]) -> u64 {
        if !self.rank_in_place() {
            return match self.kind {
                CollKind::Scatter => self.check_output(buf),
                _ => 0,
            };
        }
        match self.kind {
            CollKind::AllReduce
            | CollKind::Reduce
            | CollKind::Broadcast
            | CollKind::ReduceScatter
            | CollKind::AllGather
            | CollKind::AllToAll
            | CollKind::Gather
            | CollKind::Scan => self.check_output(buf),
            // Rank 0's buffer keeps its input.
            CollKind::ExclusiveScan if self.rank == 0 => crate::par::count_bad(0..buf.len(), |j| {
                buf[j].to_f64() == self.input::<T>(0, j).to_f64()
            }),
            CollKind::ExclusiveScan => self.check_output(buf),
            CollKind::Scatter => crate::par::count_bad(0..buf.len(), |j| {
                buf[j].to_f64() == self.input::<T>(self.root, j).to_f64()
            }),
        }
    }

    fn ok<T: Elem>(&self, got: T, k: usize) -> bool {
        let (want, tol) = self.expected::<T>(k);
        if tol == 0.0 {
            if T::DATATYPE.is_float() {
                got.to_f64() == want.to_f64()
            } else {
                got == want
            }
        } else {
            (got.to_f64() - want.to_f64()).abs() <= tol
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(kind: CollKind, op: ReduceOp, rank: usize) -> Case {
        Case {
            kind,
            op,
            count: 5,
            nranks: 4,
            rank,
            root: 1,
        }
    }

    /// Simulate a collective on all ranks with plain Rust and check that the
    /// checker accepts it (and rejects a corrupted element).
    fn simulate<T: Elem>(kind: CollKind, op: ReduceOp) {
        if !op.applies_to(T::DATATYPE) {
            return;
        }
        for rank in 0..4 {
            let c = case(kind, op, rank);
            let mut out: Vec<T> = (0..c.output_len()).map(|k| c.expected::<T>(k).0).collect();
            assert_eq!(c.check_output(&out), 0, "{kind:?} {op:?} {:?}", T::DATATYPE);
            if let Some(x) = out.first_mut() {
                // (Rank 0 of exclusive_scan must keep the poison.)
                let poison = Case::poison::<T>();
                *x = if *x == poison { T::from_int(1) } else { poison };
                assert_eq!(c.check_output(&out), 1, "{kind:?} {op:?} {:?}", T::DATATYPE);
            }
        }
    }

    #[test]
    fn expected_values_are_self_consistent() {
        for kind in CollKind::ALL {
            let ops: &[ReduceOp] = if kind.reduces() {
                &ReduceOp::ALL
            } else {
                &[ReduceOp::Sum]
            };
            for &op in ops {
                simulate::<f32>(kind, op);
                simulate::<f16>(kind, op);
                simulate::<bf16>(kind, op);
                simulate::<i8>(kind, op);
                simulate::<u8>(kind, op);
                simulate::<u64>(kind, op);
            }
        }
    }

    #[test]
    fn reductions_match_hand_computation() {
        // Rank inputs at j = 0 for the sum pattern: ((5r + 1) % 7) - 3.
        let c = case(CollKind::AllReduce, ReduceOp::Sum, 0);
        let xs: Vec<i64> = (0..4).map(|r| ((5 * r + 1) % 7) - 3).collect();
        assert_eq!(c.expected::<i32>(0).0 as i64, xs.iter().sum::<i64>());
        let m = case(CollKind::AllReduce, ReduceOp::Max, 0);
        assert_eq!(m.expected::<f32>(0).0 as i64, *xs.iter().max().unwrap());
        let a = case(CollKind::AllReduce, ReduceOp::Avg, 0);
        assert_eq!(a.expected::<i32>(0).0 as i64, xs.iter().sum::<i64>() / 4);
        // Unsigned values are not shifted.
        let u: Vec<i64> = (0..4).map(|r| (5 * r + 1) % 7).collect();
        assert_eq!(c.expected::<u8>(0).0 as i64, u.iter().sum::<i64>());
        let x = case(CollKind::AllReduce, ReduceOp::BitXor, 0);
        assert_eq!(
            x.expected::<i32>(0).0 as i64,
            xs.iter().fold(0, |a, b| a ^ b)
        );
        // Logical inputs at j = 0: ranks 0 and 1 hold 0, ranks 2 and 3 not.
        let land = case(CollKind::AllReduce, ReduceOp::LogicalAnd, 0);
        assert_eq!(land.expected::<u8>(0).0, 0);
        let lor = case(CollKind::AllReduce, ReduceOp::LogicalOr, 0);
        assert_eq!(lor.expected::<i64>(0).0, 1);
        let lxor = case(CollKind::AllReduce, ReduceOp::LogicalXor, 0);
        assert_eq!(lxor.expected::<u32>(0).0, 0);
        // Prefixes: ranks 0..=2 (scan) and 0..2 (exclusive_scan) at rank 2.
        let s = case(CollKind::Scan, ReduceOp::Sum, 2);
        assert_eq!(s.expected::<i64>(0).0, xs[..3].iter().sum::<i64>());
        let e = case(CollKind::ExclusiveScan, ReduceOp::Max, 2);
        assert_eq!(e.expected::<i8>(0).0 as i64, *xs[..2].iter().max().unwrap());
        let e0 = case(CollKind::ExclusiveScan, ReduceOp::Sum, 0);
        assert_eq!(e0.expected::<f32>(0).0, Case::poison::<f32>());
        let mut buf = vec![0f32; e0.in_place_len()];
        e0.fill_in_place(&mut buf);
        assert_eq!(e0.check_in_place(&buf), 0, "rank 0 keeps its input");
    }

    #[test]
    fn in_place_layouts() {
        let c = case(CollKind::AllGather, ReduceOp::Sum, 2);
        let mut buf = vec![0f32; c.in_place_len()];
        c.fill_in_place(&mut buf);
        assert_eq!(buf[10], c.input::<f32>(2, 0));
        assert_eq!(buf[0], Case::poison::<f32>());
        // A correct in-place all_gather result checks clean.
        let out: Vec<f32> = (0..20).map(|k| c.expected::<f32>(k).0).collect();
        assert_eq!(c.check_in_place(&out), 0);
        // Scatter root: buffer unchanged is correct.
        let s = case(CollKind::Scatter, ReduceOp::Sum, 1);
        let mut sb = vec![0i32; s.in_place_len()];
        s.fill_in_place(&mut sb);
        assert_eq!(s.check_in_place(&sb), 0);
        // Non-root gather is not in place and has nothing to check.
        let g = case(CollKind::Gather, ReduceOp::Sum, 0);
        assert!(!g.rank_in_place());
        assert_eq!(g.in_place_len(), 5);
    }
}
