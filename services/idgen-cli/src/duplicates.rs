//! `idgen duplicates`: the first three steps of a duplicate-ID incident in one command — find
//! every ID that occurs more than once (in a file, or a PostgreSQL column), decode each, and with
//! `--leases` show who held its machine number around its timestamp.
//!
//! A file is read in bounded memory: runs of at most `--memory-ids` IDs are sorted and spilled
//! to temporary files, then merged (an external merge sort), so a file of any size needs
//! `--memory-ids` × 8 bytes and a small buffer per run. A table is asked one
//! `GROUP BY` of the column (its groups of more than one, and how many rows it counted), so the
//! database does the work and nothing is loaded.
//!
//! With `--metrics-file`, each run leaves its outcome for the node exporter's textfile collector,
//! which is what the `IdgenDuplicateIdsFound` and `IdgenDuplicateCheckStale` alerts read: a daily
//! job (`infra/systemd/idgen-duplicates@.timer`) turns "someone ran the check" into a page.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use idgen::core::Schedule;
use idgen_worker::WorkerConfig;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use crate::table::{Table, text};
use crate::tls;

#[derive(Args)]
pub struct DuplicatesArgs {
    /// A file of IDs, one per line (or a CSV with --csv); `-` reads standard input.
    file: Option<PathBuf>,
    /// The file is CSV: take the IDs from column --column (1-based); a header line that is not
    /// an ID is skipped.
    #[arg(long, requires = "file")]
    csv: bool,
    /// With --csv, the column of the IDs (1-based); with --postgres, the column's name.
    #[arg(long)]
    column: Option<String>,
    /// Look in a PostgreSQL table instead of a file: the database URL.
    #[arg(long, conflicts_with = "file", requires_all = ["table", "column"])]
    postgres: Option<String>,
    /// With --postgres, the table (optionally schema.table).
    #[arg(long)]
    table: Option<String>,
    /// IDs held in memory at once while sorting a file (8 bytes each); more are spilled to
    /// temporary files and merged.
    #[arg(long, default_value_t = 8_000_000)]
    memory_ids: usize,
    /// The registry, for the schedule and region names (default: the built-in schedule).
    #[arg(long, env = "IDGEN_REGISTRY_URL", value_parser = crate::registry_url)]
    registry: Option<String>,
    /// A worker configuration naming the lease store: show the audit history of each
    /// duplicate's machine number around its timestamp.
    #[arg(long)]
    leases: Option<PathBuf>,
    /// How far either side of a duplicate's timestamp to show lease history (ms).
    #[arg(long, default_value_t = 600_000)]
    window_ms: i64,
    /// One JSON object per duplicate (NDJSON), then none: the summary goes to stderr.
    #[arg(long)]
    json: bool,
    /// Leave the run's outcome in this file, in the node exporter's textfile format (replaced
    /// atomically, readable by all): duplicated IDs found, IDs checked, when the run ended and
    /// whether it succeeded; a failed run keeps the last successful one's figures. The file's
    /// name without `.prom` is the `check` label.
    #[arg(long, value_name = "PATH")]
    metrics_file: Option<PathBuf>,
    #[command(flatten)]
    tls: tls::ClientTls,
}

/// An ID seen more than once, and how often.
struct Duplicate {
    id: u64,
    count: u64,
}

/// Finds and prints the duplicates; `Ok(true)` when there is none. With `--metrics-file`, the
/// outcome (a failure too) is written there first.
pub async fn run(args: DuplicatesArgs) -> anyhow::Result<bool> {
    let outcome = find(&args).await;
    if let Some(path) = &args.metrics_file {
        let ended = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let written = write_metrics(path, outcome.as_ref().ok().copied(), ended as i64);
        match (&outcome, written) {
            (_, Ok(())) => {}
            (Ok(_), Err(error)) => return Err(error),
            // The run's own error is the one to report; the file's is logged beside it.
            (Err(_), Err(error)) => eprintln!("idgen: {error:#}"),
        }
    }
    outcome.map(|(found, _)| found == 0)
}

/// Finds and prints every duplicate: (how many IDs are duplicated, how many IDs were checked).
async fn find(args: &DuplicatesArgs) -> anyhow::Result<(u64, u64)> {
    let (duplicates, scanned) = match (&args.postgres, &args.file) {
        (Some(url), _) => {
            let (table, column) =
                (args.table.as_deref().unwrap_or_default(), args.column.as_deref().unwrap_or_default());
            let (duplicates, rows) = from_postgres(url, table, column).await?;
            (duplicates, Some(rows))
        }
        (None, Some(file)) => {
            let column = match (args.csv, &args.column) {
                (false, _) => None,
                (true, Some(column)) => Some(
                    column.parse::<usize>().ok().filter(|c| *c >= 1).context("--column: a column number, from 1")?,
                ),
                (true, None) => bail!("--csv needs --column N"),
            };
            let (duplicates, scanned) = from_file(file, column, args.memory_ids.max(1024))?;
            (duplicates, Some(scanned))
        }
        (None, None) => bail!("give a file of IDs (or -) or --postgres URL --table T --column C"),
    };

    let (schedule, names) = schedule(args).await?;
    let leases = match &args.leases {
        Some(file) => Some(WorkerConfig::load(Some(file))?),
        None => None,
    };
    for duplicate in &duplicates {
        let mut decoded = idgen_worker::api::decode_to_json(&duplicate.id.to_string(), &schedule, &names)
            .unwrap_or_else(
                |e| json!({"id": duplicate.id.to_string(), "error": {"code": e.code(), "message": e.message()}}),
            );
        if let Ok(fields) = schedule.decode(duplicate.id) {
            decoded["unix_ms"] = json!(fields.timestamp.unix_ms());
        }
        let holders = match &leases {
            Some(config) => Some(holders(config, &decoded, args.window_ms).await),
            None => None,
        };
        print(duplicate, &decoded, holders.as_ref(), args.json);
    }
    let checked = scanned.unwrap_or_default();
    let in_what = match (&args.postgres, checked) {
        (Some(_), n) => format!("among {n} IDs in the column"),
        (None, n) => format!("among {n} IDs"),
    };
    eprintln!("{} duplicated IDs {in_what}", duplicates.len());
    Ok((duplicates.len() as u64, checked))
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabel {
    check: String,
}

/// What a run leaves for the node exporter, per check (one file each).
#[derive(Default)]
struct RunMetrics {
    found: Family<CheckLabel, Gauge>,
    checked: Family<CheckLabel, Gauge>,
    last_success: Family<CheckLabel, Gauge>,
    last_run: Family<CheckLabel, Gauge>,
    succeeded: Family<CheckLabel, Gauge>,
}

impl RunMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "idgen_duplicates_found",
            "IDs seen more than once by the last successful idgen duplicates run",
            self.found.clone(),
        );
        registry.register(
            "idgen_duplicates_ids_checked",
            "IDs (rows, for a table) the last successful idgen duplicates run read",
            self.checked.clone(),
        );
        registry.register(
            "idgen_duplicates_last_success_timestamp_seconds",
            "When the last successful idgen duplicates run ended, Unix seconds (0: none yet)",
            self.last_success.clone(),
        );
        registry.register(
            "idgen_duplicates_last_run_timestamp_seconds",
            "When the last idgen duplicates run ended, successful or not, Unix seconds",
            self.last_run.clone(),
        );
        registry.register(
            "idgen_duplicates_last_run_success",
            "1 if the last idgen duplicates run succeeded (duplicates found or not), 0 if it failed",
            self.succeeded.clone(),
        );
    }
}

/// Replaces `path` with this run's outcome: `found` (duplicated IDs, IDs checked) for a
/// successful run, `None` for a failed one, which keeps the figures and the success time the
/// file held. Written to a temporary file beside it and renamed, so the collector never reads
/// half a file; made readable by all (the node exporter runs as its own user).
fn write_metrics(path: &Path, found: Option<(u64, u64)>, ended_unix_s: i64) -> anyhow::Result<()> {
    let check = path.file_stem().map(|s| s.to_string_lossy().into_owned()).context("--metrics-file: no file name")?;
    let label = CheckLabel { check };
    let previous = std::fs::read_to_string(path).unwrap_or_default();
    let kept = |name: &str| -> i64 {
        previous
            .lines()
            .find(|line| line.starts_with(name) && line[name.len()..].starts_with('{'))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse::<f64>().ok())
            .map_or(0, |value| value as i64)
    };
    let (duplicates, checked, last_success) = match found {
        Some((duplicates, checked)) => (duplicates as i64, checked as i64, ended_unix_s),
        None => (
            kept("idgen_duplicates_found"),
            kept("idgen_duplicates_ids_checked"),
            kept("idgen_duplicates_last_success_timestamp_seconds"),
        ),
    };
    let metrics = RunMetrics::default();
    metrics.found.get_or_create(&label).set(duplicates);
    metrics.checked.get_or_create(&label).set(checked);
    metrics.last_success.get_or_create(&label).set(last_success);
    metrics.last_run.get_or_create(&label).set(ended_unix_s);
    metrics.succeeded.get_or_create(&label).set(i64::from(found.is_some()));
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).context("encoding the run's metrics")?;

    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    // A dot-file without `.prom`: the collector reads only `*.prom`.
    let mut file = tempfile::Builder::new()
        .prefix(".idgen-duplicates-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("--metrics-file: a temporary file in {}", dir.display()))?;
    file.write_all(text.as_bytes()).context("--metrics-file: writing")?;
    file.as_file().sync_all().context("--metrics-file: writing")?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.as_file().set_permissions(std::fs::Permissions::from_mode(0o644)).context("--metrics-file: mode")?;
    }
    file.persist(path).with_context(|| format!("--metrics-file: replacing {}", path.display()))?;
    Ok(())
}

async fn schedule(args: &DuplicatesArgs) -> anyhow::Result<(Schedule, HashMap<u32, String>)> {
    match &args.registry {
        None => Ok((WorkerConfig::default().schedule(), HashMap::new())),
        Some(url) => {
            let snapshot = idgen::RegistrySnapshot::fetch_with(&args.tls.client()?, url).await?;
            Ok((snapshot.schedule()?, snapshot.region_names()))
        }
    }
}

/// The lease history of the duplicate's machine number within `window_ms` of its timestamp.
async fn holders(config: &WorkerConfig, decoded: &Value, window_ms: i64) -> Value {
    let (Some(layout), Some(machine), Some(at)) =
        (decoded["layout"].as_str(), decoded["machine"].as_u64(), decoded["unix_ms"].as_i64())
    else {
        return json!({"error": "the ID does not decode to a layout, machine and time"});
    };
    let history = async {
        let store = idgen_worker::open_lease_store(config, layout).await?;
        anyhow::Ok(store.history(Some(machine as u32), at - window_ms, at + window_ms).await?)
    };
    match history.await {
        Err(error) => json!({"error": format!("{error:#}")}),
        Ok(events) => Value::Array(
            events
                .iter()
                .map(|e| {
                    json!({
                        "event": e.kind.as_str(), "holder": e.holder, "lease_epoch": e.lease_epoch,
                        "lease_expiry": idgen::core::format_unix_ms(e.lease_expiry),
                        "at": idgen::core::format_unix_ms(e.at_unix_ms), "at_ms": e.at_unix_ms,
                    })
                })
                .collect(),
        ),
    }
}

fn print(duplicate: &Duplicate, decoded: &Value, holders: Option<&Value>, json: bool) {
    if json {
        let mut line = json!({"id": duplicate.id.to_string(), "count": duplicate.count, "decoded": decoded});
        if let Some(holders) = holders {
            line["holders"] = holders.clone();
        }
        println!("{line}");
        return;
    }
    let fields = ["layout", "created_at", "region_number", "region", "machine", "sequence"]
        .iter()
        .filter_map(|f| decoded.get(*f).map(|v| format!("{f} {}", v.as_str().map_or(v.to_string(), str::to_owned))))
        .collect::<Vec<_>>()
        .join("  ");
    println!("{}  seen {} times  {fields}", duplicate.id, duplicate.count);
    match holders {
        Some(Value::Array(events)) if events.is_empty() => println!("    no lease history in the window"),
        Some(Value::Array(events)) => {
            let mut table = Table::new(&["AT", "EVENT", "EPOCH", "EXPIRY", "HOLDER"]).right(&[2]);
            for e in events {
                table.row([
                    text(&e["at"]),
                    text(&e["event"]),
                    text(&e["lease_epoch"]),
                    text(&e["lease_expiry"]),
                    text(&e["holder"]),
                ]);
            }
            for line in table.render().lines() {
                println!("    {line}");
            }
        }
        Some(other) => println!("    lease history unavailable: {}", other["error"].as_str().unwrap_or("")),
        None => {}
    }
}

/// The column's duplicates, counted by the database, and how many rows hold an ID: one scan
/// (the groups are made once and read twice: those of more than one, and the sum of all).
async fn from_postgres(url: &str, table: &str, column: &str) -> anyhow::Result<(Vec<Duplicate>, u64)> {
    let table = quoted_identifier(table, true)?;
    let column = quoted_identifier(column, false)?;
    let mut connection: sqlx::PgConnection = sqlx::Connection::connect(url)
        .await
        .with_context(|| format!("connecting to {}", idgen::config::redacted_url(url)))?;
    let query = format!(
        "WITH counted AS (SELECT {column} AS id, count(*) AS n FROM {table} WHERE {column} IS NOT NULL GROUP BY {column}) \
         SELECT id::text, n FROM counted WHERE n > 1 \
         UNION ALL SELECT NULL, coalesce(sum(n), 0)::bigint FROM counted"
    );
    let rows: Vec<(Option<String>, i64)> =
        sqlx::query_as(&query).fetch_all(&mut connection).await.context("the duplicate query")?;
    let mut rows_with_an_id = 0;
    let mut duplicates = Vec::new();
    for (text, count) in rows {
        let Some(text) = text else {
            rows_with_an_id = count as u64;
            continue;
        };
        let id = text.trim().parse::<u64>().with_context(|| format!("the column holds {text:?}, not an ID"))?;
        duplicates.push(Duplicate { id, count: count as u64 });
    }
    duplicates.sort_unstable_by_key(|d| d.id);
    Ok((duplicates, rows_with_an_id))
}

/// `name` (or `schema.name` where allowed) as a quoted SQL identifier: letters, digits and
/// underscores only, so nothing a caller types becomes SQL.
fn quoted_identifier(name: &str, schema_allowed: bool) -> anyhow::Result<String> {
    let parts: Vec<&str> = name.split('.').collect();
    let valid = |p: &&str| {
        !p.is_empty()
            && p.len() <= 63
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !p.starts_with(|c: char| c.is_ascii_digit())
    };
    if parts.len() > if schema_allowed { 2 } else { 1 } || !parts.iter().all(valid) {
        bail!(
            "{name:?} is not a plain identifier (letters, digits, underscores{})",
            if schema_allowed { "; schema.table" } else { "" }
        );
    }
    Ok(parts.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join("."))
}

/// Every duplicate in the file, and how many IDs it holds, in bounded memory.
fn from_file(path: &PathBuf, column: Option<usize>, memory_ids: usize) -> anyhow::Result<(Vec<Duplicate>, u64)> {
    let input: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(File::open(path).with_context(|| format!("opening {}", path.display()))?)
    };
    let progress = std::io::stderr().is_terminal();
    let spill_dir = tempfile::tempdir().context("a temporary directory for sorted runs")?;
    let mut runs: Vec<PathBuf> = Vec::new();
    let mut chunk: Vec<u64> = Vec::with_capacity(memory_ids.min(1 << 20));
    let (mut scanned, mut line_number) = (0u64, 0u64);
    let mut line = String::new();
    let mut reader = BufReader::with_capacity(1 << 16, input);
    loop {
        line.clear();
        if reader.read_line(&mut line).context("reading the IDs")? == 0 {
            break;
        }
        line_number += 1;
        let field = match column {
            None => line.trim(),
            Some(n) => line.trim_end_matches(['\n', '\r']).split(',').nth(n - 1).unwrap_or("").trim().trim_matches('"'),
        };
        if field.is_empty() {
            continue;
        }
        let id = match field.parse::<u64>() {
            Ok(id) => id,
            // A CSV header.
            Err(_) if column.is_some() && line_number == 1 => continue,
            Err(_) => bail!("line {line_number}: {field:?} is not an ID (a decimal 64-bit number)"),
        };
        chunk.push(id);
        scanned += 1;
        if chunk.len() >= memory_ids {
            runs.push(spill(&mut chunk, spill_dir.path(), runs.len())?);
        }
        if progress && scanned % 1_000_000 == 0 {
            eprint!("\r{scanned} IDs read, {} runs sorted", runs.len());
        }
    }
    if progress {
        eprint!("\r{scanned} IDs read; merging {} runs\x1b[K\n", runs.len() + 1);
    }
    chunk.sort_unstable();
    let duplicates = if runs.is_empty() {
        count_repeats(chunk.into_iter().map(Ok))?
    } else {
        runs.push(spill(&mut chunk, spill_dir.path(), runs.len())?);
        merge(&runs)?
    };
    Ok((duplicates, scanned))
}

/// Sorts `chunk` and writes it to a run file (little-endian u64s); empties `chunk`.
fn spill(chunk: &mut Vec<u64>, dir: &std::path::Path, n: usize) -> anyhow::Result<PathBuf> {
    chunk.sort_unstable();
    let path = dir.join(format!("run-{n}"));
    let mut out = BufWriter::with_capacity(1 << 16, File::create(&path).context("writing a sorted run")?);
    for id in chunk.iter() {
        out.write_all(&id.to_le_bytes())?;
    }
    out.flush()?;
    chunk.clear();
    Ok(path)
}

/// The runs merged in order (a heap of each run's next ID), repeats counted.
fn merge(runs: &[PathBuf]) -> anyhow::Result<Vec<Duplicate>> {
    let mut readers = runs
        .iter()
        .map(|p| Ok(BufReader::with_capacity(1 << 16, File::open(p)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let next = |reader: &mut BufReader<File>| -> std::io::Result<Option<u64>> {
        let mut bytes = [0u8; 8];
        match reader.read_exact(&mut bytes) {
            Ok(()) => Ok(Some(u64::from_le_bytes(bytes))),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e),
        }
    };
    let mut heap = BinaryHeap::new();
    for (i, reader) in readers.iter_mut().enumerate() {
        if let Some(id) = next(reader)? {
            heap.push(Reverse((id, i)));
        }
    }
    let merged = std::iter::from_fn(|| {
        let Reverse((id, i)) = heap.pop()?;
        match next(&mut readers[i]) {
            Ok(Some(following)) => heap.push(Reverse((following, i))),
            Ok(None) => {}
            Err(e) => return Some(Err(anyhow::Error::from(e).context("reading a sorted run"))),
        }
        Some(Ok(id))
    });
    count_repeats(merged)
}

/// The values of a sorted sequence that occur more than once, with their counts.
fn count_repeats(sorted: impl Iterator<Item = anyhow::Result<u64>>) -> anyhow::Result<Vec<Duplicate>> {
    let mut duplicates = Vec::new();
    let mut current: Option<(u64, u64)> = None;
    for id in sorted {
        let id = id?;
        current = match current {
            Some((value, count)) if value == id => Some((value, count + 1)),
            previous => {
                if let Some((value, count)) = previous.filter(|(_, c)| *c > 1) {
                    duplicates.push(Duplicate { id: value, count });
                }
                Some((id, 1))
            }
        };
    }
    if let Some((value, count)) = current.filter(|(_, c)| *c > 1) {
        duplicates.push(Duplicate { id: value, count });
    }
    Ok(duplicates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &std::path::Path, text: &str) -> PathBuf {
        let path = dir.join("ids.txt");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn found(duplicates: &[Duplicate]) -> Vec<(u64, u64)> {
        duplicates.iter().map(|d| (d.id, d.count)).collect()
    }

    #[test]
    fn the_merge_of_spilled_runs_finds_what_one_sort_finds() {
        let dir = tempfile::tempdir().unwrap();
        // 50,000 distinct IDs in a scrambled order, 7 planted three times and 3 twice.
        let mut ids: Vec<u64> = (0..50_000u64).map(|i| (i * 7_919) % 50_021 + 1_000_000).collect();
        ids.extend([1_000_007, 1_000_007, 1_003_000, 1_049_000]);
        let text: String = ids.iter().map(|i| format!("{i}\n")).collect();
        let path = file(dir.path(), &text);
        let in_memory = from_file(&path, None, 10_000_000).unwrap();
        let spilled = from_file(&path, None, 1_024).unwrap();
        let expected = vec![(1_000_007, 3), (1_003_000, 2), (1_049_000, 2)];
        assert_eq!(found(&in_memory.0), expected);
        assert_eq!(found(&spilled.0), expected);
        assert_eq!((in_memory.1, spilled.1), (50_004, 50_004));
    }

    #[test]
    fn csv_columns_headers_and_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), "order,id\na,5\nb,\"6\"\nc,5\n");
        assert_eq!(found(&from_file(&path, Some(2), 1_024).unwrap().0), vec![(5, 2)]);
        let path = file(dir.path(), "5\nfive\n");
        let error = from_file(&path, None, 1_024).err().unwrap().to_string();
        assert!(error.contains("line 2") && error.contains("five"), "{error}");
    }

    #[test]
    fn identifiers_are_plain_or_refused() {
        assert_eq!(quoted_identifier("orders", true).unwrap(), "\"orders\"");
        assert_eq!(quoted_identifier("shop.orders", true).unwrap(), "\"shop\".\"orders\"");
        for bad in ["orders; DROP TABLE x", "a\"b", "", "shop.orders", "1st"] {
            assert!(quoted_identifier(bad, false).is_err(), "{bad:?} accepted");
        }
    }
}
