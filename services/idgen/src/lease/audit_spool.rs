//! An audit record is never lost: one the audit table would not take (after the SDK's own
//! retries with backoff) is appended to a local spool file and fsynced before the caller goes
//! on, then written to the table by a background replayer, with backoff, once it answers.
//!
//! The spool is a directory (`lease.dynamodb.audit_spool`, by default `audit-spool/` beside the
//! schedule copy). Each process appends to a file of its own,
//! `<audit table>.<pid>-<random>.spool`, one JSON record per line, and holds an exclusive
//! `flock` on it for as long as it lives. A replayer takes its own file by renaming it aside
//! (the lock stays with the open file) and writes it out; it also takes any other file of the
//! same audit table whose lock it can get, because the process that wrote it is gone (a crash, a
//! `kill -9`, an operator's CLI that exited while the table was down). A file is removed only
//! after every line in it was written.
//!
//! Every record carries the event key it was first tried with, so writing one twice (a replay
//! cut short, two replayers racing for a dead process's file) leaves one item, not two.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::lease::StoreError;
use crate::metrics::{AuditSpoolMetrics, TableLabel};

/// One audit item exactly as the audit table stores it (see `dynamodb.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpooledRecord {
    pub machine_id: u32,
    /// `<20-digit Unix ms>#<event>#<random>`: fixed when the record is made, so a replay
    /// overwrites rather than duplicates.
    pub event_key: String,
    pub event: String,
    pub holder: String,
    pub lease_epoch: u64,
    pub lease_expiry: i64,
    pub at_unix_ms: i64,
}

/// Where spooled records are written once the table answers.
#[async_trait]
pub trait AuditSink: Send + Sync + 'static {
    async fn put(&self, record: &SpooledRecord) -> Result<(), StoreError>;
}

/// The first pause after a failed replay; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How often the directory is looked at for files of processes that are gone.
const SCAN_INTERVAL: Duration = Duration::from_secs(5);

/// A spool file this process holds the lock of.
struct Held {
    path: PathBuf,
    file: File,
    /// Lines in the file, and how many of them were already written to the table.
    lines: u64,
    written: u64,
}

struct Files {
    /// The file new records go to (created at the first record).
    own: Option<Held>,
    /// Files set aside for the replayer: our own earlier ones and those of processes now gone.
    /// A file stays here until it is removed, so a replay cut short resumes it.
    aside: Vec<Held>,
    /// How many own files this process has made (the last part of their names).
    made: u64,
}

/// The spool of one audit table in one directory, shared by every store of this process on that
/// table ([`AuditSpool::shared`]).
pub struct AuditSpool {
    dir: PathBuf,
    table: String,
    /// `<pid>-<random>`: this process's part of its file names.
    me: String,
    /// Where records are written (replaced if the runtime the replayer ran on is gone).
    sink: Mutex<Arc<dyn AuditSink>>,
    files: Mutex<Files>,
    /// Records in the files this process holds that are not written yet.
    waiting: AtomicU64,
    /// One replay at a time (the background task, or a final flush).
    replaying: tokio::sync::Mutex<()>,
    wake: Arc<Notify>,
    replayer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    metrics: &'static AuditSpoolMetrics,
}

/// The spools of this process, so two stores on one audit table share one file and one
/// replayer, and a final flush can reach them all. A spool lives as long as its process: its
/// records outlive the store that wrote them.
static SPOOLS: LazyLock<Mutex<HashMap<SpoolKey, Arc<AuditSpool>>>> = LazyLock::new(Default::default);

/// A spool directory and an audit table.
type SpoolKey = (PathBuf, String);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// fsyncs a directory, so a file created or renamed in it survives a crash.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The file's lines (without their newline), read from its start. A last line without a
/// newline is a line too: a write cut off by a crash, which will not parse.
fn read_lines(file: &File) -> io::Result<Vec<Vec<u8>>> {
    let mut reader = file.try_clone()?;
    reader.rewind()?;
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes)?;
    let mut lines: Vec<Vec<u8>> = bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    if lines.last().is_some_and(Vec::is_empty) {
        lines.pop();
    }
    Ok(lines)
}

impl AuditSpool {
    /// The spool of `table` in `dir` (created if missing), with its replayer running on the
    /// current Tokio runtime; the one this process already has, if any.
    pub fn shared(dir: &Path, table: &str, sink: Arc<dyn AuditSink>) -> io::Result<Arc<AuditSpool>> {
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let key = (dir.clone(), table.to_owned());
        let mut spools = lock(&SPOOLS);
        if let Some(spool) = spools.get(&key) {
            // Its replayer ran on a runtime that is gone: this one takes over, with this sink.
            if lock(&spool.replayer).as_ref().is_none_or(|task| task.is_finished()) {
                *lock(&spool.sink) = sink;
                spool.spawn_replayer();
            }
            return Ok(spool.clone());
        }
        let spool = Arc::new(AuditSpool::new(dir, table, sink)?);
        spools.insert(key, spool.clone());
        spool.spawn_replayer();
        Ok(spool)
    }

    fn new(dir: PathBuf, table: &str, sink: Arc<dyn AuditSink>) -> io::Result<AuditSpool> {
        // A directory we cannot write to must fail the start, not the first lost record.
        let probe = dir.join(format!(".probe-{}-{:016x}", std::process::id(), rand::random::<u64>()));
        File::create(&probe)?;
        std::fs::remove_file(&probe)?;
        let metrics = crate::metrics::audit_spool();
        let label = TableLabel { table: table.to_owned() };
        // Every series exists from the start, at 0, so an alert sees the first increase.
        metrics.waiting.get_or_create(&label).set(0);
        for family in [&metrics.spooled, &metrics.replayed, &metrics.lost] {
            let _ = family.get_or_create(&label);
        }
        Ok(AuditSpool {
            dir,
            table: table.to_owned(),
            me: format!("{}-{:016x}", std::process::id(), rand::random::<u64>()),
            sink: Mutex::new(sink),
            files: Mutex::new(Files { own: None, aside: Vec::new(), made: 0 }),
            waiting: AtomicU64::new(0),
            replaying: tokio::sync::Mutex::new(()),
            wake: Arc::new(Notify::new()),
            replayer: Mutex::new(None),
            metrics,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records spooled by this process (or taken over from a gone one) and not written yet.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Acquire)
    }

    fn label(&self) -> TableLabel {
        TableLabel { table: self.table.clone() }
    }

    /// Called with `files` locked, so that a record is counted before the replayer can see it.
    fn set_waiting(&self, delta: i64) {
        let apply = |n: u64| n.saturating_add_signed(delta);
        let before = self.waiting.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(apply(n)));
        let now = apply(before.unwrap_or_else(|n| n));
        self.metrics.waiting.get_or_create(&self.label()).set(now as i64);
    }

    /// A new own file, locked before it has a name another process would take
    /// (`<table>.<me>-<n>.spool`): made as a dot-file, locked, then renamed into place.
    fn create_own(&self, made: &mut u64) -> io::Result<Held> {
        *made += 1;
        let name = format!("{}.{}-{}.spool", self.table, self.me, made);
        let making = self.dir.join(format!(".{name}.new"));
        let file = OpenOptions::new().create_new(true).append(true).read(true).open(&making)?;
        file.try_lock().map_err(|error| io::Error::other(format!("locking {}: {error}", making.display())))?;
        let path = self.dir.join(name);
        std::fs::rename(&making, &path)?;
        sync_dir(&self.dir)?;
        Ok(Held { path, file, lines: 0, written: 0 })
    }

    /// Appends `record` and fsyncs it: when this returns `Ok`, the record survives a crash.
    /// On an error nothing of it stays in the file (a half line would swallow the next record).
    pub fn append(&self, record: &SpooledRecord) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut files = lock(&self.files);
        if files.own.is_none() {
            let own = self.create_own(&mut files.made)?;
            files.own = Some(own);
        }
        let own = files.own.as_mut().expect("made above");
        let before = own.file.metadata()?.len();
        if let Err(error) = own.file.write_all(&line).and_then(|()| own.file.sync_data()) {
            if own.file.set_len(before).and_then(|()| own.file.sync_data()).is_err() {
                // Beyond repair: its whole records are still replayed; new ones start a new file.
                let broken = files.own.take().expect("held above");
                files.aside.push(broken);
            }
            return Err(error);
        }
        own.lines += 1;
        self.set_waiting(1);
        drop(files);
        self.metrics.spooled.get_or_create(&self.label()).inc();
        self.wake.notify_one();
        Ok(())
    }

    /// Writes out everything this process can take: its own records, and the files of
    /// processes that are gone. `Ok(n)`: all written (`n` records); `Err`: the table still
    /// refuses, and what was not written stays spooled. Safe to cancel: a file leaves the list
    /// (and is unlocked) only once it is removed, and its progress is kept.
    pub async fn replay(&self) -> Result<u64, StoreError> {
        let _one = self.replaying.lock().await;
        let io = |what: &str, error: io::Error| {
            StoreError::Unavailable(format!("spool {}: {what}: {error}", self.dir.display()))
        };
        self.set_aside().map_err(|e| io("taking files", e))?;
        let sink = lock(&self.sink).clone();
        let mut total = 0;
        loop {
            let next =
                lock(&self.files).aside.first().map(|held| (held.path.clone(), held.file.try_clone(), held.written));
            let Some((path, file, written)) = next else { return Ok(total) };
            let lines = file.and_then(|file| read_lines(&file)).map_err(|e| io("reading", e))?;
            for (index, line) in lines.iter().enumerate().skip(written as usize) {
                match serde_json::from_slice::<SpooledRecord>(line) {
                    Ok(record) => {
                        sink.put(&record).await?;
                        self.metrics.replayed.get_or_create(&self.label()).inc();
                        total += 1;
                    }
                    // Only a write cut off before its fsync (never acknowledged) leaves this.
                    Err(error) => {
                        let text = String::from_utf8_lossy(line);
                        tracing::error!(%error, file = %path.display(), line = %text, "audit record lost: unreadable spool line");
                        self.metrics.lost.get_or_create(&self.label()).inc();
                    }
                }
                let mut files = lock(&self.files);
                if let Some(held) = files.aside.iter_mut().find(|held| held.path == path) {
                    held.written = index as u64 + 1;
                    self.set_waiting(-1);
                }
            }
            // Every line written: the file goes, then its lock (a crash between the two only
            // means it is replayed again, which overwrites the same items).
            if let Err(error) = std::fs::remove_file(&path)
                && error.kind() != io::ErrorKind::NotFound
            {
                return Err(io("removing a replayed file", error));
            }
            let _ = sync_dir(&self.dir);
            let mut files = lock(&self.files);
            if let Some(at) = files.aside.iter().position(|held| held.path == path) {
                let held = files.aside.remove(at);
                let unread = held.lines.saturating_sub(held.written);
                self.set_waiting(-(unread as i64));
            }
        }
    }

    /// Moves our own file aside (new records start a new one) and takes the files of processes
    /// that are gone.
    fn set_aside(&self) -> io::Result<()> {
        {
            let mut files = lock(&self.files);
            if let Some(own) = files.own.take_if(|own| own.lines > 0) {
                files.aside.push(own);
            }
        }
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if !self.is_ours_to_take(&path) || lock(&self.files).aside.iter().any(|held| held.path == path) {
                continue;
            }
            // Read-only is enough for the lock, and for files another user wrote.
            let file = match File::open(&path) {
                Ok(file) => file,
                Err(error) => {
                    tracing::error!(%error, file = %path.display(), "cannot open an audit spool file to replay it");
                    continue;
                }
            };
            if file.try_lock().is_err() {
                continue; // its process is alive and replays it itself
            }
            // Removed by another replayer between our listing and our lock.
            if std::os::unix::fs::MetadataExt::nlink(&file.metadata()?) == 0 {
                continue;
            }
            let lines = read_lines(&file)?.len() as u64;
            tracing::warn!(file = %path.display(), records = lines, "taking over the audit spool of a process that is gone");
            let mut files = lock(&self.files);
            files.aside.push(Held { path, file, lines, written: 0 });
            self.set_waiting(lines as i64);
        }
        Ok(())
    }

    /// A spool file of this audit table written by another process: `<table>.<id>.spool`, where
    /// the id has no dot (a table name may have dots, so the name is split at the last one) and
    /// is not this process's.
    fn is_ours_to_take(&self, path: &Path) -> bool {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return false };
        let Some(stem) = name.strip_suffix(".spool") else { return false };
        stem.rsplit_once('.').is_some_and(|(table, id)| {
            table == self.table && !id.is_empty() && !id.starts_with(&format!("{}-", self.me))
        })
    }

    fn spawn_replayer(self: &Arc<Self>) {
        let spool = self.clone();
        let wake = self.wake.clone();
        let task = tokio::spawn(async move {
            // The first pass at once: a process starting up writes what a gone one left.
            let mut backoff: Option<Duration> = Some(Duration::ZERO);
            loop {
                match backoff {
                    // The table refused: wait it out, whatever is appended meanwhile.
                    Some(pause) => tokio::time::sleep(pause).await,
                    None => {
                        tokio::select! {
                            _ = wake.notified() => tokio::time::sleep(MIN_BACKOFF).await,
                            _ = tokio::time::sleep(SCAN_INTERVAL) => {}
                        }
                    }
                }
                match spool.replay().await {
                    Ok(0) => backoff = None,
                    Ok(written) => {
                        tracing::info!(table = %spool.table, records = written, "spooled audit records written");
                        backoff = None;
                    }
                    Err(error) => {
                        let next = backoff.map_or(MIN_BACKOFF, |b| (b * 2).clamp(MIN_BACKOFF, MAX_BACKOFF));
                        tracing::warn!(%error, table = %spool.table, waiting = spool.waiting(), retry_in = ?next, "audit table still refuses spooled records");
                        backoff = Some(next);
                    }
                }
            }
        });
        *lock(&self.replayer) = Some(task);
    }
}

/// One last attempt, for a process about to exit: every live spool of this process replayed,
/// for at most `within`. Returns what is still waiting (it stays on disk for the next process
/// that uses the same directory).
pub async fn flush_all(within: Duration) -> u64 {
    let spools: Vec<Arc<AuditSpool>> = lock(&SPOOLS).values().cloned().collect();
    let mut left = 0;
    for spool in spools {
        if spool.waiting() == 0 {
            continue;
        }
        let _ = tokio::time::timeout(within, spool.replay()).await;
        left += spool.waiting();
    }
    left
}

/// Where each live spool with records waiting is, and how many: for a message at exit.
pub fn waiting_spools() -> Vec<(PathBuf, String, u64)> {
    lock(&SPOOLS)
        .values()
        .filter(|spool| spool.waiting() > 0)
        .map(|spool| (spool.dir.clone(), spool.table.clone(), spool.waiting()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table that refuses until told otherwise, and keeps what it took by event key.
    #[derive(Default)]
    struct Table {
        down: std::sync::atomic::AtomicBool,
        items: Mutex<HashMap<String, SpooledRecord>>,
        puts: AtomicU64,
    }

    #[async_trait]
    impl AuditSink for Table {
        async fn put(&self, record: &SpooledRecord) -> Result<(), StoreError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("down".into()));
            }
            self.puts.fetch_add(1, Ordering::SeqCst);
            lock(&self.items).insert(record.event_key.clone(), record.clone());
            Ok(())
        }
    }

    fn record(n: u32) -> SpooledRecord {
        SpooledRecord {
            machine_id: n,
            event_key: format!("{:020}#claim#{n:016x}", 1_000 + n),
            event: "claim".into(),
            holder: format!("h{n}"),
            lease_epoch: u64::from(n),
            lease_expiry: 5_000,
            at_unix_ms: 1_000 + i64::from(n),
        }
    }

    fn spool_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".spool"))
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn records_wait_on_disk_while_the_table_refuses_and_are_written_once_it_answers() {
        let dir = tempfile::tempdir().unwrap();
        let table = Arc::new(Table::default());
        table.down.store(true, Ordering::SeqCst);
        let spool = Arc::new(AuditSpool::new(dir.path().into(), "t-audit", table.clone()).unwrap());
        for n in 0..5 {
            spool.append(&record(n)).unwrap();
        }
        assert_eq!(spool.waiting(), 5);
        let on_disk = std::fs::read_to_string(dir.path().join(&spool_files(dir.path())[0])).unwrap();
        assert_eq!(on_disk.lines().count(), 5, "each record is on disk when append returns");
        assert!(spool.replay().await.is_err());
        assert_eq!(spool.waiting(), 5, "nothing is dropped while the table refuses");
        // Appends go on while the first file is set aside.
        spool.append(&record(5)).unwrap();
        table.down.store(false, Ordering::SeqCst);
        assert_eq!(spool.replay().await.unwrap(), 6);
        assert_eq!(spool.waiting(), 0);
        assert_eq!(lock(&table.items).len(), 6);
        assert_eq!(spool_files(dir.path()), Vec::<String>::new(), "written files are removed");
    }

    #[tokio::test]
    async fn a_replay_cut_short_resumes_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let table = Arc::new(Table::default());
        let spool = Arc::new(AuditSpool::new(dir.path().into(), "t-audit", table.clone()).unwrap());
        for n in 0..3 {
            spool.append(&record(n)).unwrap();
        }
        // The table goes down after the first put.
        struct Flaky(Arc<Table>);
        #[async_trait]
        impl AuditSink for Flaky {
            async fn put(&self, record: &SpooledRecord) -> Result<(), StoreError> {
                let result = self.0.put(record).await;
                self.0.down.store(true, Ordering::SeqCst);
                result
            }
        }
        let flaky = Arc::new(AuditSpool::new(dir.path().into(), "t-audit", Arc::new(Flaky(table.clone()))).unwrap());
        drop(spool); // its process is gone: the lock is released, the file stays
        assert!(flaky.replay().await.is_err());
        assert_eq!(flaky.waiting(), 2);
        table.down.store(false, Ordering::SeqCst);
        let mut left = 2;
        while left > 0 {
            table.down.store(false, Ordering::SeqCst);
            let _ = flaky.replay().await;
            left = flaky.waiting();
        }
        assert_eq!(table.puts.load(Ordering::SeqCst), 3, "no record written twice, none skipped");
        assert_eq!(lock(&table.items).len(), 3);
    }

    #[tokio::test]
    async fn a_gone_process_file_is_taken_over_and_a_live_one_is_left_to_its_owner() {
        let dir = tempfile::tempdir().unwrap();
        let table = Arc::new(Table::default());
        table.down.store(true, Ordering::SeqCst);
        let live = Arc::new(AuditSpool::new(dir.path().into(), "t-audit", table.clone()).unwrap());
        let gone = Arc::new(AuditSpool::new(dir.path().into(), "t-audit", table.clone()).unwrap());
        let other_table = Arc::new(AuditSpool::new(dir.path().into(), "t-audit.x-audit", table.clone()).unwrap());
        live.append(&record(1)).unwrap();
        gone.append(&record(2)).unwrap();
        other_table.append(&record(3)).unwrap();
        drop(gone);
        table.down.store(false, Ordering::SeqCst);
        let heir = Arc::new(AuditSpool::new(dir.path().into(), "t-audit", table.clone()).unwrap());
        assert_eq!(heir.replay().await.unwrap(), 1, "only the gone process's file");
        assert!(lock(&table.items).values().all(|r| r.machine_id == 2));
        assert_eq!(live.replay().await.unwrap(), 1);
        assert_eq!(other_table.replay().await.unwrap(), 1);
        assert_eq!(lock(&table.items).len(), 3);
        assert_eq!(spool_files(dir.path()), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_torn_last_line_is_counted_lost_and_the_rest_written() {
        let dir = tempfile::tempdir().unwrap();
        let table = Arc::new(Table::default());
        let good = serde_json::to_string(&record(7)).unwrap();
        std::fs::write(dir.path().join("t-audit.1-dead.spool"), format!("{good}\n{{\"machine_id\": 8, \"ev")).unwrap();
        let spool = Arc::new(AuditSpool::new(dir.path().into(), "t-audit", table.clone()).unwrap());
        let lost = spool.metrics.lost.get_or_create(&spool.label()).get();
        assert_eq!(spool.replay().await.unwrap(), 1);
        assert_eq!(spool.metrics.lost.get_or_create(&spool.label()).get(), lost + 1);
        assert_eq!(spool.waiting(), 0);
        assert_eq!(spool_files(dir.path()), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_replay_cancelled_midway_keeps_the_file_and_its_count() {
        /// A table that takes one record, then hangs (until let go).
        struct Hanging {
            table: Arc<Table>,
            hang: std::sync::atomic::AtomicBool,
        }
        #[async_trait]
        impl AuditSink for Hanging {
            async fn put(&self, record: &SpooledRecord) -> Result<(), StoreError> {
                if self.hang.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                self.hang.store(true, Ordering::SeqCst);
                self.table.put(record).await
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let table = Arc::new(Table::default());
        let sink = Arc::new(Hanging { table: table.clone(), hang: false.into() });
        let spool = Arc::new(AuditSpool::new(dir.path().into(), "t-audit", sink.clone()).unwrap());
        for n in 0..3 {
            spool.append(&record(n)).unwrap();
        }
        // A final flush that runs out of time in the middle of the file.
        assert!(tokio::time::timeout(Duration::from_millis(50), spool.replay()).await.is_err());
        assert_eq!(spool.waiting(), 2, "the written one is counted, the others still wait");
        // The file is still this process's: another spool of the directory cannot take it.
        let other = Arc::new(AuditSpool::new(dir.path().into(), "t-audit", table.clone()).unwrap());
        assert_eq!(other.replay().await.unwrap(), 0);
        sink.hang.store(false, Ordering::SeqCst);
        while spool.waiting() > 0 {
            sink.hang.store(false, Ordering::SeqCst);
            let _ = tokio::time::timeout(Duration::from_millis(50), spool.replay()).await;
        }
        assert_eq!(table.puts.load(Ordering::SeqCst), 3, "resumed where it stopped: none twice, none skipped");
        assert_eq!(spool_files(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn an_unwritable_directory_fails_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        assert!(AuditSpool::new(file.join("spool"), "t-audit", Arc::new(Table::default())).is_err());
    }
}
