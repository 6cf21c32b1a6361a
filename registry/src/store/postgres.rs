//! The store's rooms compiled for PostgreSQL's own driver: the same files as
//! [`sqlite`](super::sqlite), with `Db` this driver.

// One text compiled for each driver, on purpose: the rooms are loaded once per driver.
#![allow(clippy::duplicate_mod)]

type Db = sqlx::Postgres;

#[path = "audit.rs"]
pub mod audit;
#[path = "regions.rs"]
pub mod regions;
#[path = "schedule.rs"]
pub mod schedule;
