//! The `idemkv` binary: everything is in `idemkv::cli`.

fn main() -> std::process::ExitCode {
    idemkv::cli::run()
}
