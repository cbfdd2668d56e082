//! Entry points for fuzzing (a cargo-fuzz crate outside the workspace
//! calls them; see SECURITY.md): every parser of bytes that another
//! process wrote, taking arbitrary bytes and returning whether they were
//! accepted. Not API: hidden from the documentation, with no stability
//! promise.
//!
//! Each parser checks its fields against each other (offsets inside
//! allocations, sizes within their limits) and has a deterministic
//! randomized test beside it that runs in CI; these functions let
//! libFuzzer search further.

use crate::backend::shared::shm;

/// A segment's creator header (`backend/shared/shm/creator.rs`).
pub fn segment_header(data: &[u8]) -> bool {
    shm::parse_creator(data).is_ok()
}

/// The host backend's layout header after the control block
/// (`backend/host/shm.rs`).
pub fn host_segment_layout(data: &[u8]) -> bool {
    crate::backend::host::shm::parse_layout(data).is_ok()
}

/// The host backend's setup exchange; the first byte picks the rank count.
pub fn host_setup_exchange(data: &[u8]) -> bool {
    let Some((&n, rest)) = data.split_first() else {
        return false;
    };
    crate::backend::host::exchange::parse(
        rest,
        usize::from(n % 16) + 1,
        1 << 30,
        crate::backend::host::MAX_CHANNELS,
    )
    .is_ok()
}

/// A point-to-point message's envelope (`p2p/envelope.rs`).
pub fn p2p_envelope(data: &[u8]) -> bool {
    crate::p2p::parse_envelope(data)
}

/// A `/proc/<pid>/stat` line's start time.
pub fn proc_stat_start_time(data: &[u8]) -> bool {
    std::str::from_utf8(data)
        .ok()
        .and_then(crate::backend::shared::process::parse_start_time)
        .is_some()
}

/// A `/dev/shm` entry name.
pub fn segment_name(data: &[u8]) -> bool {
    std::str::from_utf8(data)
        .ok()
        .and_then(shm::parse_segment_name)
        .is_some()
}

/// The CUDA backend's setup exchange; the first byte picks the rank count.
#[cfg(feature = "cuda")]
pub fn cuda_setup_exchange(data: &[u8]) -> bool {
    let Some((&n, rest)) = data.split_first() else {
        return false;
    };
    crate::backend::cuda::parsers::setup_exchange(rest, usize::from(n % 16) + 1).is_ok()
}

/// A copy-engine board post (`backend/cuda/peer_mem/board.rs`).
#[cfg(feature = "cuda")]
pub fn board_post(data: &[u8]) -> bool {
    crate::backend::cuda::parsers::parse_post(data).is_ok()
}

/// A descriptor message's payload; the first byte gives the descriptor
/// count (low bits) and the truncation flag (bit 7).
#[cfg(feature = "cuda")]
pub fn fd_message(data: &[u8]) -> bool {
    let Some((&f, rest)) = data.split_first() else {
        return false;
    };
    crate::backend::cuda::parsers::fd_message(rest, usize::from(f & 3), f & 0x80 != 0).is_ok()
}

/// The descriptor links' name exchange; the first byte picks the rank
/// count.
#[cfg(feature = "cuda")]
pub fn socket_names(data: &[u8]) -> bool {
    let Some((&n, rest)) = data.split_first() else {
        return false;
    };
    crate::backend::cuda::parsers::socket_names(rest, usize::from(n % 16) + 1).is_ok()
}
