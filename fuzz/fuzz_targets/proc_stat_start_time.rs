#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = gpucoll::fuzzing::proc_stat_start_time(data);
});
