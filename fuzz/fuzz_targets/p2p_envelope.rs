#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = gpucoll::fuzzing::p2p_envelope(data);
});
