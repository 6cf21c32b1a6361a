//! Test support for the store suites: a throwaway database (a SQLite file in a temporary
//! directory, or a fresh PostgreSQL database on the server `IDGEN_POSTGRES_URL` names;
//! ./scripts/test starts it) and [`store_suite!`] to run one suite on both databases. PostgreSQL
//! unreachable or the variable unset: the test fails, it never skips. [`openapi`]: what each
//! service's router test holds its OpenAPI document to; [`routes`]: what the HTTP metrics' own
//! route label is held to.

use sqlx::Connection;

pub mod openapi;
pub mod routes;

/// Dropped, it removes what it made: the directory, or the PostgreSQL database.
pub struct TestDatabase {
    url: String,
    _dir: Option<tempfile::TempDir>,
    /// The server's admin URL and the database's name, to drop it afterwards.
    postgres: Option<(String, String)>,
    /// Roles made for this database ([`TestDatabase::login_role`]), dropped after it.
    roles: std::sync::Mutex<Vec<String>>,
}

impl TestDatabase {
    /// A SQLite database `file` in a fresh temporary directory.
    pub fn sqlite(file: &str) -> TestDatabase {
        let dir = tempfile::tempdir().expect("creating a temporary directory");
        let url = format!("sqlite://{}", dir.path().join(file).display());
        TestDatabase { url, _dir: Some(dir), postgres: None, roles: Default::default() }
    }

    /// A fresh PostgreSQL database named `idgen_<prefix>_test_<pid>_<random>`.
    pub async fn postgres(prefix: &str) -> TestDatabase {
        let admin = std::env::var("IDGEN_POSTGRES_URL")
            .expect("IDGEN_POSTGRES_URL is not set: these tests need PostgreSQL (./scripts/test starts it)");
        let name = format!("idgen_{prefix}_test_{}_{}", std::process::id(), rand::random::<u32>());
        let mut conn = sqlx::PgConnection::connect(&admin).await.expect("connecting to PostgreSQL");
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("creating a test database");
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(base, _)| base);
        TestDatabase {
            url: format!("{base}/{name}"),
            _dir: None,
            postgres: Some((admin, name)),
            roles: Default::default(),
        }
    }

    /// PostgreSQL: a new role that may log in and nothing else (the server trusts loopback), and
    /// the URL of this database as that role: a service's runtime role, before `init` grants it
    /// anything. Dropped with the database.
    pub async fn login_role(&self) -> String {
        let (admin, _) = self.postgres.as_ref().expect("roles are PostgreSQL's");
        let role = format!("idgen_test_role_{}_{}", std::process::id(), rand::random::<u32>());
        let mut conn = sqlx::PgConnection::connect(admin).await.expect("connecting to PostgreSQL");
        sqlx::query(&format!("CREATE ROLE {role} LOGIN")).execute(&mut conn).await.expect("creating a role");
        self.roles.lock().unwrap_or_else(|p| p.into_inner()).push(role.clone());
        let (scheme, rest) = self.url.split_once("://").expect("a URL");
        let place = rest.rsplit_once('@').map_or(rest, |(_, place)| place);
        format!("{scheme}://{role}@{place}")
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let Some((admin, name)) = self.postgres.take() else { return };
        let roles = std::mem::take(&mut *self.roles.lock().unwrap_or_else(|p| p.into_inner()));
        // Drop runs inside the test's runtime, which cannot block on itself: a thread of its own
        // with a runtime of its own. FORCE ends the connections a pool may still hold. A failure
        // here is not the test's: ./scripts/test drops leftovers at the start of the next run.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async {
                let drop = async {
                    let mut conn = sqlx::PgConnection::connect(&admin).await.ok()?;
                    let dropped = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await
                        .ok();
                    // Its privileges went with the database.
                    for role in roles {
                        let _ = sqlx::query(&format!("DROP ROLE IF EXISTS {role}")).execute(&mut conn).await;
                    }
                    dropped
                };
                // A hung server must not hang the test that already finished.
                tokio::time::timeout(std::time::Duration::from_secs(10), drop).await.ok().flatten()
            })
        });
        let _ = dropped.join();
    }
}

/// `store_suite!(test_a, test_b)` makes a module per database, `sqlite` and `postgres`, with
/// one `#[tokio::test]` per name, each calling `super::test_a(super::sqlite().await)` (and
/// `super::postgres()`): the same suite on both databases, from one list, so that no test runs
/// on one and is forgotten on the other.
#[macro_export]
macro_rules! store_suite {
    ($($test:ident),+ $(,)?) => {
        $crate::store_suite!(@on sqlite: $($test),+);
        $crate::store_suite!(@on postgres: $($test),+);
    };
    (@on $db:ident: $($test:ident),+) => {
        mod $db {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$test(super::$db().await).await;
                }
            )+
        }
    };
}
