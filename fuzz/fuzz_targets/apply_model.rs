#![no_main]

libfuzzer_sys::fuzz_target!(|input: idemkv_fuzz::apply_model::Input| {
    idemkv_fuzz::apply_model::run(&input)
});
