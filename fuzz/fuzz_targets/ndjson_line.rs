#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemkv_fuzz::ndjson_line::run(data));
