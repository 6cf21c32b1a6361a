//! The store's rooms compiled for SQLite's own driver: the same files as
//! [`postgres`](super::postgres), with `Db` this driver.

// One text compiled for each driver, on purpose: the rooms are loaded once per driver.
#![allow(clippy::duplicate_mod)]

type Db = sqlx::Sqlite;

#[path = "audit.rs"]
pub mod audit;
#[path = "regions.rs"]
pub mod regions;
#[path = "schedule.rs"]
pub mod schedule;
