//! `idgen duplicates` through the binary: planted duplicates among a million IDs in a file (merged
//! from spilled runs) and in a PostgreSQL table (one GROUP BY), exactly those reported; a 100 MB
//! file within a stated memory bound; the holders of a duplicate's machine number read from a
//! real audit table on the DynamoDB-protocol server; and `--metrics-file`, what a daily job leaves
//! for the node exporter (and the alerts read) after runs that find, fail and find nothing.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

use idgen_e2e::{idgen_bin, shared_dynamodb_endpoint, unique_table};
use serde_json::Value;

fn duplicates(args: &[&str]) -> Output {
    Command::new(idgen_bin()).arg("duplicates").args(args).output().unwrap()
}

/// id → count, from the NDJSON output.
fn reported(out: &Output) -> BTreeMap<u64, u64> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            (v["id"].as_str().unwrap().parse().unwrap(), v["count"].as_u64().unwrap())
        })
        .collect()
}

/// `n` distinct v1-looking IDs in a scrambled order (a multiplicative permutation of 0..n).
fn distinct(n: u64) -> impl Iterator<Item = u64> {
    const PRIME: u64 = 1_000_003; // > n for the sizes here, so i ↦ i·k mod p is one-to-one
    (0..n).map(move |i| 7_400_000_000_000_000_000 + (i * 7_919) % PRIME)
}

fn write_ids(path: &Path, ids: impl Iterator<Item = u64>) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for id in ids {
        writeln!(out, "{id}").unwrap();
    }
    out.flush().unwrap();
}

#[test]
fn planted_duplicates_among_a_million_ids_in_a_file_exactly_those() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u64> = distinct(1_000_000).collect();
    let (a, b, c) = (ids[17], ids[500_000], ids[999_999]);
    let planted = [a, b, b, c];
    let path = dir.path().join("ids.txt");
    write_ids(&path, ids.iter().copied().chain(planted));

    // Runs of 100,000: ten spilled and merged.
    let out = duplicates(&[path.to_str().unwrap(), "--memory-ids", "100000", "--json"]);
    assert_eq!(out.status.code(), Some(3), "duplicates found exit 3: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(reported(&out), BTreeMap::from([(a, 2), (b, 3), (c, 2)]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("3 duplicated IDs among 1000004 IDs"));

    // Without the planted ones: nothing, exit 0.
    write_ids(&path, ids.iter().copied());
    let out = duplicates(&[path.to_str().unwrap(), "--memory-ids", "100000", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty());

    // A bad line is named, not skipped.
    std::fs::write(&path, "1\n2\nnot-an-id\n").unwrap();
    let out = duplicates(&[path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 3"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn planted_duplicates_in_a_postgres_column_found_by_the_database() {
    let url = std::env::var("IDGEN_POSTGRES_URL").expect("IDGEN_POSTGRES_URL (./scripts/test sets it)");
    let table = unique_table("dup").replace('-', "_");
    let psql = |sql: &str| {
        let out = Command::new("psql").args([url.as_str(), "-qAtc", sql]).output().expect("psql");
        assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
    };
    psql(&format!(
        "CREATE TABLE {table} (id bigint); INSERT INTO {table} SELECT 7400000000000000000 + g FROM generate_series(1, 1000000) g;
         INSERT INTO {table} VALUES (7400000000000000017), (7400000000000500000), (7400000000000500000), (NULL), (NULL);"
    ));
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("idgen-duplicates-orders.prom");
    let out = duplicates(&[
        "--postgres",
        &url,
        "--table",
        &table,
        "--column",
        "id",
        "--json",
        "--metrics-file",
        metrics.to_str().unwrap(),
    ]);
    psql(&format!("DROP TABLE {table}"));
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(reported(&out), BTreeMap::from([(7_400_000_000_000_000_017, 2), (7_400_000_000_000_500_000, 3)]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 duplicated IDs among 1000003 IDs in the column"));
    // The rows holding an ID (NULLs aside), counted in the same query.
    let written = samples(&metrics);
    assert_eq!(written["idgen_duplicates_found"], 2.0);
    assert_eq!(written["idgen_duplicates_ids_checked"], 1_000_003.0);

    // A table name that is not a plain identifier never reaches SQL.
    let out = duplicates(&["--postgres", &url, "--table", "x; DROP TABLE y", "--column", "id"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a plain identifier"));
}

/// The samples of a textfile-collector file, by metric name (each with `check` = the file's name).
fn samples(path: &Path) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(path).unwrap();
    let check = path.file_stem().unwrap().to_str().unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line}"));
            let (name, labels) = series.split_once('{').unwrap_or_else(|| panic!("no labels: {line}"));
            assert_eq!(labels, format!("check=\"{check}\"}}"), "{line}");
            (name.to_owned(), value.parse().unwrap())
        })
        .collect()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as f64
}

/// A daily run's file: replaced whole each time, readable by the collector, the run's outcome
/// (found, checked, when, succeeded); a failed run keeps the last success's figures and time, so
/// the page stays up and the staleness ticket sees how old the last success is.
#[test]
fn each_run_leaves_its_outcome_for_the_node_exporter() {
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.txt");
    let metrics = dir.path().join("idgen-duplicates-export.prom");
    let run = |ids: &Path| duplicates(&[ids.to_str().unwrap(), "--metrics-file", metrics.to_str().unwrap()]);

    write_ids(&ids, [5, 6, 7, 5, 8, 7, 7].into_iter());
    let before = unix_now();
    assert_eq!(run(&ids).status.code(), Some(3));
    let found = samples(&metrics);
    assert_eq!(
        (
            found["idgen_duplicates_found"],
            found["idgen_duplicates_ids_checked"],
            found["idgen_duplicates_last_run_success"]
        ),
        (2.0, 7.0, 1.0)
    );
    let success_at = found["idgen_duplicates_last_success_timestamp_seconds"];
    assert!(success_at >= before && success_at <= unix_now(), "{found:?}");
    assert_eq!(found["idgen_duplicates_last_run_timestamp_seconds"], success_at);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&metrics).unwrap().permissions().mode() & 0o777, 0o644);
    let text = std::fs::read_to_string(&metrics).unwrap();
    for name in found.keys() {
        assert!(text.contains(&format!("# TYPE {name} gauge\n")), "{text}");
    }

    // A run that fails (a line that is no ID): success 0, the last success's figures kept.
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    std::fs::write(&ids, "1\nnot-an-id\n").unwrap();
    assert_eq!(run(&ids).status.code(), Some(1));
    let failed = samples(&metrics);
    assert_eq!(failed["idgen_duplicates_last_run_success"], 0.0);
    assert_eq!(failed["idgen_duplicates_found"], 2.0, "the page stays up through a failed run");
    assert_eq!(failed["idgen_duplicates_last_success_timestamp_seconds"], success_at);
    assert!(failed["idgen_duplicates_last_run_timestamp_seconds"] > success_at);

    // The duplicates repaired: the next run finds none.
    write_ids(&ids, [5, 6, 7, 8].into_iter());
    assert_eq!(run(&ids).status.code(), Some(0));
    let clean = samples(&metrics);
    assert_eq!((clean["idgen_duplicates_found"], clean["idgen_duplicates_ids_checked"]), (0.0, 4.0));
    assert_eq!(clean["idgen_duplicates_last_run_success"], 1.0);
    assert!(clean["idgen_duplicates_last_success_timestamp_seconds"] > success_at);
    // Only the file itself is left in the collector's directory (no temporary file).
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "{names:?}");

    // A failed first run (no file yet): success 0, never succeeded (0), nothing found.
    let first = dir.path().join("idgen-duplicates-new.prom");
    let out =
        duplicates(&[dir.path().join("missing.txt").to_str().unwrap(), "--metrics-file", first.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let never = samples(&first);
    assert_eq!(never["idgen_duplicates_last_success_timestamp_seconds"], 0.0);
    assert_eq!((never["idgen_duplicates_found"], never["idgen_duplicates_last_run_success"]), (0.0, 0.0));
}

/// The largest peak resident set of this test process's children so far, in KiB.
fn children_peak_kib() -> i64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_maxrss
}

#[test]
fn a_100_mb_file_within_12_mib_more_than_a_one_line_file() {
    let dir = tempfile::tempdir().unwrap();
    // The process's own footprint first (a debug build of the whole CLI, its TLS and AWS code
    // mapped in: about 17 MiB, and growing with the binary), from a file of one ID.
    let one = dir.path().join("one.txt");
    write_ids(&one, [7_400_000_000_000_000_000].into_iter());
    assert_eq!(duplicates(&[one.to_str().unwrap(), "--json"]).status.code(), Some(0));
    let own_kib = children_peak_kib();

    let path = dir.path().join("big.txt");
    // 5.3 million 19-digit IDs: 106 MB; two of them planted twice.
    let n = 5_300_000u64;
    let ids = (0..n).map(|i| 7_400_000_000_000_000_000 + i * 3);
    write_ids(&path, ids.chain([7_400_000_000_000_000_300, 7_400_000_000_015_000_000]));
    assert!(std::fs::metadata(&path).unwrap().len() > 100_000_000);

    // Runs of 1,000,000 IDs (8 MB): six spilled and merged. What the file adds to the process
    // is the run being sorted and a buffer per run, never the file (106 MB) or its IDs (42 MB).
    let out = duplicates(&[path.to_str().unwrap(), "--memory-ids", "1000000", "--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(reported(&out), BTreeMap::from([(7_400_000_000_000_000_300, 2), (7_400_000_000_015_000_000, 2)]));
    let added_mib = (children_peak_kib() - own_kib) / 1024;
    assert!(added_mib < 12, "the 106 MB file with 8 MB runs added {added_mib} MiB to the process's own {own_kib} KiB");
}

#[tokio::test]
async fn a_duplicate_shows_who_held_its_machine_number_from_the_audit_table() {
    let endpoint = shared_dynamodb_endpoint();
    let table = unique_table("dup-holders");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("leases.toml");
    std::fs::write(
        &config,
        format!(
            "development = true\n[lease]\nstore = \"dynamodb\"\ntables = {{ v1 = \"{table}\", v2 = \"{table}-v2\" }}\n[lease.dynamodb]\nregion = \"eu-west-1\"\nendpoint = \"{endpoint}\"\n"
        ),
    )
    .unwrap();
    let init = Command::new(idgen_bin())
        .args(["leases", "--config", config.to_str().unwrap(), "--layout", "v1", "init"])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));

    // A worker's claim of machine 37, through the store: the audit table records it.
    let settings =
        idgen::DynamoDbSettings { region: "eu-west-1".into(), endpoint: Some(endpoint), ..Default::default() };
    let store = idgen::DynamoDbLeaseStore::new(idgen::lease::dynamodb::client(&settings).await, &table);
    use idgen::LeaseStore;
    let now = idgen::system_unix_ms();
    let holder = "orders-api-7/pid-4121/1764590000000/9f1c";
    let claimed = store.claim_as(37, holder, &idgen::ClaimToken::random(), now, now + 300_000).await.unwrap();
    assert!(matches!(claimed, idgen::ClaimOutcome::Claimed(_)));

    // An ID of machine 37 a second later, seen twice.
    let id = (((now + 1_000 - idgen::core::EPOCH_UNIX_MS) as u64) << 22) | (37 << 12) | 5;
    let ids = dir.path().join("ids.txt");
    std::fs::write(&ids, format!("{id}\n1\n{id}\n")).unwrap();
    let out = duplicates(&[ids.to_str().unwrap(), "--leases", config.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let line: Value = serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(line["decoded"]["machine"], 37, "{line}");
    assert_eq!(line["decoded"]["layout"], "v1", "{line}");
    let holders = line["holders"].as_array().unwrap_or_else(|| panic!("no holders: {line}"));
    assert!(
        holders.iter().any(|e| e["holder"] == holder && e["lease_epoch"].as_u64() == Some(1)),
        "the claim by {holder} is not shown: {line}"
    );

    // The human form names the holder too.
    let out = duplicates(&[ids.to_str().unwrap(), "--leases", config.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("seen 2 times") && text.contains("machine 37") && text.contains(holder), "{text}");
}
