//! What the registry and the public-ID service do with their database before they serve from it:
//! find out whether it is theirs (empty, another service's, or theirs with migrations pending),
//! and apply their migrations when told to (`idgen registry init`, `idgen public init`). A
//! production service never initializes a database by itself: one that started over on an empty
//! database would hand out region numbers again, or a new data key under which every encrypted
//! public ID already given out no longer resolves.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;

/// How long a request waits for its service's database (the registry's and the public-ID
/// service's `database_acquire_timeout_ms` and `database_statement_timeout_ms`): for a free
/// connection of the pool, and for one statement (PostgreSQL's `statement_timeout`, set on every
/// connection). Past either the request is answered 503 with `Retry-After` instead of queueing
/// behind whatever holds the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimeouts {
    pub acquire: Duration,
    pub statement: Duration,
}

impl Default for RequestTimeouts {
    fn default() -> Self {
        RequestTimeouts { acquire: Duration::from_millis(1_000), statement: Duration::from_millis(3_000) }
    }
}

impl RequestTimeouts {
    /// The range of each (ms): under 10 ms a healthy database is refused; over a minute a request
    /// waits on the database longer than any caller does.
    pub const RANGE_MS: std::ops::RangeInclusive<u64> = 10..=60_000;

    /// How long one call of a store (a transaction of a few statements) may wait for the
    /// database in all, whatever the database does: a free connection, then two statements'
    /// time. Past it the caller is answered 503, also when the database has gone silent and
    /// the server-side statement timeout never answers.
    pub fn call_deadline(&self) -> Duration {
        self.acquire + 2 * self.statement
    }

    /// From the two configuration keys, each checked against [`Self::RANGE_MS`].
    pub fn from_keys(acquire_ms: u64, statement_ms: u64) -> anyhow::Result<Self> {
        for (key, ms) in [("database_acquire_timeout_ms", acquire_ms), ("database_statement_timeout_ms", statement_ms)]
        {
            if !Self::RANGE_MS.contains(&ms) {
                anyhow::bail!(
                    "{key} must be {} to {} (ms), not {ms}: a request waits at most that long for the database",
                    Self::RANGE_MS.start(),
                    Self::RANGE_MS.end()
                );
            }
        }
        Ok(RequestTimeouts {
            acquire: Duration::from_millis(acquire_ms),
            statement: Duration::from_millis(statement_ms),
        })
    }
}

/// A service's schema: the tables that are its own, and its migrations per database.
pub struct Schema {
    /// Its name in messages ("registry", "public-ID service").
    pub service: &'static str,
    /// Its tables, each with the privileges the running service needs on it (PostgreSQL's
    /// words, e.g. `"SELECT, INSERT"`): all a runtime role is granted ([`Connection::grant`]).
    /// sqlx's `_sqlx_migrations` is always counted as its own, and readable.
    pub tables: &'static [(&'static str, &'static str)],
    /// Sequences the service's inserts draw from (a `BIGSERIAL`'s), granted `USAGE`.
    pub sequences: &'static [&'static str],
    pub sqlite: &'static Migrator,
    pub postgres: &'static Migrator,
}

/// What a database is to a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// No tables at all: a new database, or the wrong one.
    Empty,
    /// Tables that are not the service's (named).
    Foreign(Vec<String>),
    /// The service's tables, with the versions of the migrations the binary has and the database
    /// has not applied.
    Own { pending: Vec<i64> },
}

/// A service's database through that database's own driver: the one storage design of the
/// registry's and the public-ID service's stores, and of the migrations and checks here.
///
/// Why native drivers and not sqlx's `Any`: the public-ID service binds what `Any` cannot (a
/// public ID as a `uuid`, a batch as two arrays: one statement for a batch of any size), every
/// `Any` row is copied into values of its own before it is read, and the migrations already ran
/// on the native drivers. A store writes SQL that both databases accept once and runs it on
/// either with [`on_pool!`](crate::on_pool) (the registry compiles its statements once per
/// driver); where the two differ (the public IDs' tables) it matches the pool.
#[derive(Clone, Debug)]
pub enum Pool {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

/// Runs `$body` with `$pool` bound to whichever driver's pool `$on` (a [`Pool`]) is: the same
/// sqlx calls, compiled for each.
#[macro_export]
macro_rules! on_pool {
    ($on:expr, |$pool:ident| $body:expr) => {
        match $on {
            $crate::database::Pool::Postgres($pool) => $body,
            $crate::database::Pool::Sqlite($pool) => $body,
        }
    };
}

/// How a service's serving pool behaves under load: at most `connections` (SQLite: always one,
/// which serializes its writers anyway and keeps read-then-write transactions from failing with
/// `SQLITE_BUSY`), a request waits at most `acquire_timeout` for one, and a statement runs at
/// most `statement_timeout` (PostgreSQL's own `statement_timeout`, set on every connection): an
/// exhausted pool or a slow database answers 503 quickly, never hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    pub connections: u32,
    pub acquire_timeout: Duration,
    pub statement_timeout: Duration,
}

impl PoolSettings {
    pub fn new(connections: u32, timeouts: RequestTimeouts) -> Self {
        PoolSettings { connections, acquire_timeout: timeouts.acquire, statement_timeout: timeouts.statement }
    }
}

impl Default for PoolSettings {
    /// Sixteen connections, the default timeouts.
    fn default() -> Self {
        PoolSettings::new(16, RequestTimeouts::default())
    }
}

/// A PostgreSQL URL's options with the statement timeout of `settings` on every connection.
pub fn pg_options(url: &str, settings: PoolSettings) -> Result<sqlx::postgres::PgConnectOptions, sqlx::Error> {
    let statement_timeout = settings.statement_timeout.as_millis().to_string();
    Ok(sqlx::postgres::PgConnectOptions::from_str(url)?.options([("statement_timeout", statement_timeout)]))
}

/// A write refused by a unique index or primary key (another writer took it first).
pub fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.is_unique_violation())
}

impl Pool {
    /// The pool a service serves from (`postgres://…` or `sqlite:…`), of `settings`. It checks
    /// nothing: the service refuses a database that is not its own first
    /// ([`Self::refusal`], on a [`Self::connect_one`]).
    pub async fn open(url: &str, settings: PoolSettings) -> Result<Self, sqlx::Error> {
        Ok(match url.starts_with("sqlite:") {
            false => Pool::Postgres(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(settings.connections)
                    .acquire_timeout(settings.acquire_timeout)
                    .connect_with(pg_options(url, settings)?)
                    .await?,
            ),
            true => Pool::Sqlite(
                sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(settings.acquire_timeout)
                    .connect_with(
                        sqlx::sqlite::SqliteConnectOptions::from_str(url)?.busy_timeout(Duration::from_secs(5)),
                    )
                    .await?,
            ),
        })
    }

    /// One connection (the database made if it is a new SQLite file, in WAL mode), for the
    /// migrations and the checks around them.
    pub async fn connect_one(url: &str) -> Result<Self, sqlx::Error> {
        Ok(match url.starts_with("sqlite:") {
            true => {
                let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)?
                    .create_if_missing(true)
                    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(5));
                Pool::Sqlite(sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect_with(options).await?)
            }
            false => Pool::Postgres(sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(url).await?),
        })
    }

    /// The pool's open connections and how many of them are idle (for `/metrics`).
    pub fn connections(&self) -> (u32, usize) {
        on_pool!(self, |pool| (pool.size(), pool.num_idle()))
    }

    pub async fn close(&self) {
        on_pool!(self, |pool| pool.close().await)
    }

    /// The database's tables (PostgreSQL: those of the connection's schema), sorted.
    pub async fn tables(&self) -> Result<Vec<String>, sqlx::Error> {
        let mut tables: Vec<String> = match self {
            Pool::Sqlite(pool) => {
                sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
                    .fetch_all(pool)
                    .await?
            }
            Pool::Postgres(pool) => {
                sqlx::query_scalar("SELECT tablename::TEXT FROM pg_tables WHERE schemaname = current_schema()")
                    .fetch_all(pool)
                    .await?
            }
        };
        tables.sort();
        Ok(tables)
    }

    /// What the database is to the service of `schema`.
    pub async fn found(&self, schema: &Schema) -> Result<Found, sqlx::Error> {
        let tables = self.tables().await?;
        if tables.is_empty() {
            return Ok(Found::Empty);
        }
        let own = |table: &String| table == "_sqlx_migrations" || schema.tables.iter().any(|(t, _)| t == table);
        let foreign: Vec<String> = tables.iter().filter(|t| !own(t)).cloned().collect();
        if !foreign.is_empty() {
            return Ok(Found::Foreign(foreign));
        }
        let applied: Vec<i64> = match tables.iter().any(|t| t == "_sqlx_migrations") {
            false => Vec::new(),
            true => {
                let sql = "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version";
                on_pool!(self, |pool| sqlx::query_scalar(sql).fetch_all(pool).await?)
            }
        };
        let pending = self.migrator(schema).iter().map(|m| m.version).filter(|v| !applied.contains(v)).collect();
        Ok(Found::Own { pending })
    }

    /// Applies the service's migrations still pending, refusing a database that holds tables
    /// not its own (the message names them).
    pub async fn migrate(&self, schema: &Schema) -> anyhow::Result<()> {
        if let Found::Foreign(tables) = self.found(schema).await? {
            anyhow::bail!(
                "the database holds tables that are not the {}'s ({}): point database_url at its own database",
                schema.service,
                tables.join(", ")
            );
        }
        match self {
            Pool::Sqlite(pool) => schema.sqlite.run(pool).await?,
            Pool::Postgres(pool) => schema.postgres.run(pool).await?,
        }
        Ok(())
    }

    /// Why a production service must not start on this database, if it must not: empty,
    /// another's, or migrations pending. `init` is the command that makes it right.
    pub async fn refusal(&self, schema: &Schema, init: &str) -> Result<Option<String>, sqlx::Error> {
        Ok(match self.found(schema).await? {
            Found::Empty => Some(format!(
                "the database is empty: run `{init}` once, for a new {}. If it should already hold data, do NOT: \
                 its database is gone or this is the wrong one; restore it from a backup",
                schema.service
            )),
            Found::Foreign(tables) => Some(format!(
                "the database is not the {}'s: it holds {}. Point database_url at the {}'s own database",
                schema.service,
                tables.join(", "),
                schema.service
            )),
            Found::Own { pending } if !pending.is_empty() => Some(format!(
                "the database lacks migrations {pending:?}: run `{init}` (it applies them) before starting this \
                 version"
            )),
            Found::Own { .. } => None,
        })
    }

    /// PostgreSQL: gives `role` (the one the service runs as, not the one that owns the schema
    /// and runs the migrations) exactly what the service uses: its tables' privileges from
    /// `schema` (those the database holds), its sequences, and reading `_sqlx_migrations`; nothing else (whatever it had in
    /// this schema is revoked first, so running it again after an upgrade leaves exactly the
    /// new set). No DDL, no DELETE, no TRUNCATE: a compromised or confused service cannot drop
    /// or empty its tables. SQLite has no roles: nothing to do.
    ///
    /// With `password`, the role is made (`LOGIN`, nothing else) when it does not exist, and its
    /// password set to that, so a deployment keeps it in one secret and `init` applies it.
    pub async fn grant(&self, schema: &Schema, role: &str, password: Option<&str>) -> anyhow::Result<()> {
        let Pool::Postgres(pool) = self else { return Ok(()) };
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(role)
            .fetch_one(pool)
            .await?;
        let mut statements: Vec<String> = role_statement(role, exists, password)?.into_iter().collect();
        let namespace: String = sqlx::query_scalar("SELECT current_schema()::TEXT").fetch_one(pool).await?;
        let (role, namespace) = (quoted(role), quoted(&namespace));
        statements.extend([
            format!("REVOKE ALL ON ALL TABLES IN SCHEMA {namespace} FROM {role}"),
            format!("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {namespace} FROM {role}"),
            format!("GRANT USAGE ON SCHEMA {namespace} TO {role}"),
            format!("GRANT SELECT ON {namespace}._sqlx_migrations TO {role}"),
        ]);
        // A table the service names but the database does not hold (one a later migration or
        // command dropped) has nothing to grant.
        let present = self.tables().await?;
        for (table, privileges) in schema.tables.iter().filter(|(table, _)| present.iter().any(|t| t == table)) {
            statements.push(format!("GRANT {privileges} ON {namespace}.{} TO {role}", quoted(table)));
        }
        for sequence in schema.sequences {
            statements.push(format!("GRANT USAGE ON SEQUENCE {namespace}.{} TO {role}", quoted(sequence)));
        }
        let mut tx = pool.begin().await?;
        for statement in &statements {
            sqlx::query(statement).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    fn migrator(&self, schema: &Schema) -> &'static Migrator {
        match self {
            Pool::Sqlite(_) => schema.sqlite,
            Pool::Postgres(_) => schema.postgres,
        }
    }
}

/// What a production service's `database_url` lacks, if anything: it must be PostgreSQL (SQLite
/// is for development only). `whose` names the database in the message ("the registry's").
pub fn missing_postgres_url(url: Option<&str>, whose: &str) -> Option<String> {
    match url {
        None => Some(format!("database_url (postgres://…: {whose} own PostgreSQL database)")),
        Some(url) if !url.starts_with("postgres://") && !url.starts_with("postgresql://") => Some(format!(
            "database_url as postgres://… (not {}: SQLite is for development only)",
            idgen::config::redacted_url(url)
        )),
        Some(_) => None,
    }
}

/// `init --owner-url`: the role to grant the service's privileges to, the user `runtime_url`
/// names, where it is not the owner's; `None` with no owner URL (one role does both), or the
/// same user. The two URLs must name one database.
pub fn runtime_role(owner_url: Option<&str>, runtime_url: &str) -> anyhow::Result<Option<String>> {
    let Some(owner_url) = owner_url else { return Ok(None) };
    let place = |url: &str| {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let rest = rest.rsplit_once('@').map_or(rest, |(_, place)| place);
        rest.split('?').next().unwrap_or_default().to_owned()
    };
    if !owner_url.starts_with("postgres") || place(owner_url) != place(runtime_url) {
        anyhow::bail!(
            "--owner-url must name the same PostgreSQL database as database_url ({}), as the role that owns it",
            place(runtime_url)
        );
    }
    let runtime = user_of(runtime_url)
        .ok_or_else(|| anyhow::anyhow!("database_url names no user: the role the service runs as, to grant"))?;
    Ok((user_of(owner_url).as_deref() != Some(runtime.as_str())).then_some(runtime))
}

/// The user a database URL connects as, if it names one (`postgres://user[:password]@host/db`).
pub fn user_of(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let (credentials, _) = rest.split_once('@')?;
    let user = credentials.split_once(':').map_or(credentials, |(name, _)| name);
    (!user.is_empty()).then(|| user.to_owned())
}

/// A PostgreSQL string literal (DDL takes no parameters), quoted.
/// What makes `role` (if it does not exist) and sets its password (if one is given): the
/// password's SCRAM verifier, never the password, since a statement's text is what PostgreSQL
/// logs when it fails (and the logs go to CloudWatch).
fn role_statement(role: &str, exists: bool, password: Option<&str>) -> anyhow::Result<Option<String>> {
    Ok(match (exists, password) {
        (false, None) => anyhow::bail!(
            "role {role:?} (database_url's user) does not exist: create it first (CREATE ROLE {} LOGIN), or give \
             init its password (IDGEN_RUNTIME_DATABASE_PASSWORD)",
            quoted(role)
        ),
        (false, Some(password)) => {
            Some(format!("CREATE ROLE {} LOGIN PASSWORD {}", quoted(role), literal(&scram_verifier(password)?)))
        }
        (true, Some(password)) => {
            Some(format!("ALTER ROLE {} WITH LOGIN PASSWORD {}", quoted(role), literal(&scram_verifier(password)?)))
        }
        (true, None) => None,
    })
}

/// The iterations of a verifier [`scram_verifier`] makes: PostgreSQL's own default
/// (`scram_iterations`).
const SCRAM_ITERATIONS: u32 = 4096;

/// `password`'s SCRAM-SHA-256 verifier as PostgreSQL stores it (RFC 5802 and 7677, with a random
/// 16-byte salt): `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`, each base64. Given
/// to `CREATE ROLE … PASSWORD`, it is stored as it is, and the password is never sent as SQL
/// text. PostgreSQL prepares a password with SASLprep before hashing it, which leaves printable
/// ASCII as it is; anything else is refused here rather than hashed otherwise than the server
/// would.
pub fn scram_verifier(password: &str) -> anyhow::Result<String> {
    anyhow::ensure!(
        !password.is_empty() && password.bytes().all(|b| b.is_ascii_graphic() || b == b' '),
        "the runtime role's password must be printable ASCII (IDGEN_RUNTIME_DATABASE_PASSWORD)"
    );
    let salt: [u8; 16] = rand::random();
    Ok(scram_verifier_with(password, &salt, SCRAM_ITERATIONS))
}

/// [`scram_verifier`] with this salt and count of iterations.
fn scram_verifier_with(password: &str, salt: &[u8], iterations: u32) -> String {
    use base64::Engine;
    use ring::{digest, hmac, pbkdf2};
    let mut salted = [0u8; 32];
    let rounds = std::num::NonZeroU32::new(iterations).expect("at least one iteration");
    pbkdf2::derive(pbkdf2::PBKDF2_HMAC_SHA256, rounds, salt, password.as_bytes(), &mut salted);
    let key = hmac::Key::new(hmac::HMAC_SHA256, &salted);
    let client_key = hmac::sign(&key, b"Client Key");
    let stored_key = digest::digest(&digest::SHA256, client_key.as_ref());
    let server_key = hmac::sign(&key, b"Server Key");
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    format!("SCRAM-SHA-256${iterations}:{}${}:{}", b64(salt), b64(stored_key.as_ref()), b64(server_key.as_ref()))
}

fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A PostgreSQL identifier, quoted.
fn quoted(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's example (user `user`, password `pencil`): the verifier's keys are the ones its
    /// exchange proves, checked by the server signature and the client proof it gives.
    #[test]
    fn a_scram_verifier_holds_the_keys_of_rfc_7677() {
        use base64::Engine;
        use ring::hmac;
        let b64 = base64::engine::general_purpose::STANDARD;
        let salt = b64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let verifier = scram_verifier_with("pencil", &salt, 4096);
        assert_eq!(
            verifier,
            "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
             wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="
        );
        let (_, keys) = verifier.rsplit_once('$').unwrap();
        let (stored_key, server_key) = keys.split_once(':').unwrap();
        let auth = "n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                    s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let server = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &b64.decode(server_key).unwrap()), auth.as_bytes());
        assert_eq!(b64.encode(server.as_ref()), "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
        // The client proof XOR the client signature is the client key, whose SHA-256 is StoredKey.
        let signature =
            hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &b64.decode(stored_key).unwrap()), auth.as_bytes());
        let proof = b64.decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=").unwrap();
        let client_key: Vec<u8> = proof.iter().zip(signature.as_ref()).map(|(p, s)| p ^ s).collect();
        assert_eq!(
            ring::digest::digest(&ring::digest::SHA256, &client_key).as_ref(),
            &b64.decode(stored_key).unwrap()[..]
        );
    }

    /// The statement that sets a runtime role's password carries its verifier (a new salt each
    /// time), never the password (PostgreSQL logs a failed statement's text).
    #[test]
    fn a_role_is_given_its_password_as_a_verifier_only() {
        for exists in [false, true] {
            let made = role_statement("idgen_registry", exists, Some("s3cret pass'word")).unwrap().unwrap();
            assert!(!made.contains("s3cret"), "{made}");
            assert!(made.contains(" PASSWORD 'SCRAM-SHA-256$4096:"), "{made}");
            let again = role_statement("idgen_registry", exists, Some("s3cret pass'word")).unwrap().unwrap();
            assert_ne!(made, again, "the same salt twice");
        }
        assert_eq!(role_statement("idgen_registry", true, None).unwrap(), None);
        assert!(role_statement("idgen_registry", false, None).is_err());
        assert!(role_statement("idgen_registry", false, Some("pässword")).is_err(), "not printable ASCII");
    }
}
