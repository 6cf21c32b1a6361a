//! A generator's configuration file (TOML, what an embedder and every worker read at start-up):
//! any file is either a validated configuration or an error with a message, never a panic.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use idgen::config::GeneratorConfig;
use libfuzzer_sys::fuzz_target;

fn file() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| std::env::temp_dir().join(format!("idgen-fuzz-config-{}.toml", std::process::id())))
}

fuzz_target!(|data: &[u8]| {
    std::fs::write(file(), data).expect("the temporary file is writable");
    // A prefix no environment sets: the file alone decides.
    match GeneratorConfig::load(Some(file()), "IDGEN_FUZZ_UNSET") {
        Ok(config) => config.validate().expect("a loaded configuration is valid"),
        Err(error) => assert!(!format!("{error:#}").is_empty()),
    }
});
