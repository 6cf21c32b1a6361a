//! What a public-ID mapping costs PostgreSQL, measured as a user would (`scripts/public-ids-size`,
//! through the real binary): at most 120 bytes a mapping, heap and every index, and no less than
//! the floor the page layout allows (a measurement below it would be measuring nothing).

use idgen_e2e::idgen_bin;

#[test]
fn a_mapping_costs_at_most_120_bytes_heap_and_indexes() {
    std::env::var("IDGEN_POSTGRES_URL").expect("IDGEN_POSTGRES_URL is not set: this test needs PostgreSQL");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new(root.join("scripts/public-ids-size"))
        .arg("50000")
        .env("IDGEN_BIN", idgen_bin())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // RESULT 50000 mappings: 115.3 bytes each, heap and every index (floor 100.5, goal 120)
    let result = stdout.lines().find_map(|l| l.strip_prefix("RESULT ")).expect("no RESULT line");
    let words: Vec<&str> = result.split_whitespace().collect();
    assert_eq!(words[0], "50000", "{result}");
    let bytes: f64 = words[2].parse().unwrap();
    let floor: f64 = words[10].trim_end_matches(',').parse().unwrap();
    assert!(floor > 90.0 && bytes >= floor && bytes <= 120.0, "{result}");
}
