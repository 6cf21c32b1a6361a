//! A generator's configuration file (TOML, what an embedder and every worker read at start-up):
//! any file is either a validated configuration or an error with a message, never a panic. The
//! key check that names a refused line (`idgen::config::file`) never refuses a file the strict
//! TOML reading of the same struct takes: it is at least as lenient as the reader behind it.
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
    if let Ok(text) = std::str::from_utf8(data) {
        let refused = GeneratorConfig::keys().check(text);
        if toml::from_str::<GeneratorConfig>(text).is_ok() {
            assert!(refused.is_empty(), "the strict reader takes what the key check refuses: {refused:?}");
        }
        for error in refused {
            assert!(error.line >= 1 && error.line <= text.lines().count().max(1) && !error.message.is_empty());
        }
    }
});
