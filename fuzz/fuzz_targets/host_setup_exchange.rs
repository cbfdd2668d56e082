#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = gpucoll::fuzzing::host_setup_exchange(data);
});
