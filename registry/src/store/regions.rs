//! The regions: their numbers, names, retirements and lease tables. Written once, in SQL both
//! databases accept, and compiled for each database's own driver (`super::Db`).
//!
//! Never: hands out a number that was ever used, deletes a region, or changes a retired one.
//! Every write transaction starts by settling the retirements whose time has come.

use std::collections::BTreeMap;

use idgen_server::database::is_unique_violation;
use sqlx::Row;

use super::Db;
use super::audit::audit;
use super::schedule::{read_layouts, read_schedule};
use crate::store::{
    LeaseTable, NumberInUse, REGION_COLUMNS, Region, RegionStatus, RegistryError, Reported, distinct_tables,
    since_epoch,
};

/// A region row as of `now_ms`. A retirement whose time has come reads as done (retired at that
/// time) whatever `status` still says: reads never write, and the next write makes it permanent
/// ([`settle_retirements`]).
fn region_row(row: &<Db as sqlx::Database>::Row, now_ms: i64) -> Result<Region, RegistryError> {
    let status: String = row.try_get("status")?;
    let number: i64 = row.try_get("number")?;
    let mut region = Region {
        name: row.try_get("name")?,
        number: u32::try_from(number).map_err(|_| RegistryError::Invalid(format!("region number {number}")))?,
        status: match status.as_str() {
            "active" => RegionStatus::Active,
            "retired" => RegionStatus::Retired,
            other => return Err(RegistryError::Invalid(format!("region status {other:?}"))),
        },
        created_at_ms: row.try_get("created_at_ms")?,
        retired_at_ms: row.try_get("retired_at_ms")?,
        retires_at_ms: None,
        lease_tables: BTreeMap::new(),
    };
    match (region.status, row.try_get::<Option<i64>, _>("retires_at_ms")?) {
        (RegionStatus::Active, Some(at)) if at <= now_ms => {
            (region.status, region.retired_at_ms) = (RegionStatus::Retired, Some(at));
        }
        (RegionStatus::Active, pending) => region.retires_at_ms = pending,
        (RegionStatus::Retired, _) => {}
    }
    Ok(region)
}

/// [`RegistryStore::regions`](crate::store::RegistryStore::regions) on this driver.
pub async fn regions(pool: &sqlx::Pool<Db>, now_ms: i64) -> Result<Vec<Region>, RegistryError> {
    let rows = sqlx::query(&format!("SELECT {REGION_COLUMNS} FROM regions ORDER BY number")).fetch_all(pool).await?;
    let mut regions: Vec<Region> = rows.iter().map(|row| region_row(row, now_ms)).collect::<Result<_, _>>()?;
    let mut tables = read_lease_tables(pool, None).await?;
    for region in &mut regions {
        region.lease_tables = tables.remove(&region.number).unwrap_or_default();
    }
    Ok(regions)
}

/// [`RegistryStore::add_region_with_tables`](crate::store::RegistryStore::add_region_with_tables) on this driver.
pub async fn add_region(
    pool: &sqlx::Pool<Db>,
    name: &str,
    capacity: u32,
    tables: &BTreeMap<String, String>,
    quiet_ms: i64,
    actor: &str,
    now_ms: i64,
) -> Result<Region, RegistryError> {
    for _ in 0..50 {
        let mut tx = pool.begin().await?;
        if quiet_ms > 0 {
            let initialized: Option<i64> = sqlx::query("SELECT initialized_at_ms FROM schedule_state WHERE id = 1")
                .fetch_one(&mut *tx)
                .await?
                .try_get("initialized_at_ms")?;
            if let Some(at) = initialized
                && now_ms < at.saturating_add(quiet_ms)
            {
                return Err(RegistryError::NewRegistryQuiet { initialized_at_ms: at, until_ms: at + quiet_ms });
            }
        }
        let layouts = read_layouts(&mut *tx).await?;
        if let Some(unknown) = tables.keys().find(|name| !layouts.iter().any(|l| l.layout.name() == *name)) {
            return Err(RegistryError::UnknownLayout(unknown.clone()));
        }
        let lease_tables: BTreeMap<String, LeaseTable> = layouts
            .iter()
            .map(|l| {
                let layout = l.layout.name().to_owned();
                let table = tables.get(&layout).cloned().unwrap_or_else(|| idgen::lease::default_table(&layout));
                (layout, LeaseTable { table, moved_from: None, table_id: None })
            })
            .collect();
        distinct_tables(name, &lease_tables)?;
        // A name whose retirement time has come is free again.
        settle_retirements(&mut tx, now_ms).await?;
        let active: i64 = sqlx::query("SELECT COUNT(*) AS n FROM regions WHERE name = $1 AND status = 'active'")
            .bind(name)
            .fetch_one(&mut *tx)
            .await?
            .try_get("n")?;
        if active > 0 {
            return Err(RegistryError::NameExists(name.to_owned()));
        }
        let used: Vec<i64> = sqlx::query("SELECT number FROM regions ORDER BY number")
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|row| row.try_get("number"))
            .collect::<Result<_, _>>()?;
        // Numbers generators of a registry this one replaced still issue under: never handed out
        // before their time.
        let in_use = numbers_in_use(&mut *tx, now_ms).await?;
        let withheld = |n: &i64| in_use.iter().any(|held| i64::from(held.number) == *n);
        let Some(number) = (0..i64::from(capacity)).find(|n| !used.contains(n) && !withheld(n)) else {
            let free: Vec<u32> = (0..capacity).filter(|n| !used.contains(&i64::from(*n))).collect();
            if free.is_empty() {
                return Err(RegistryError::NoNumberLeft { capacity });
            }
            let until_ms = in_use.iter().map(|held| held.until_ms).min().unwrap_or(now_ms);
            return Err(RegistryError::NumbersInUse { numbers: free, until_ms });
        };
        let inserted =
            sqlx::query("INSERT INTO regions (number, name, status, created_at_ms) VALUES ($1, $2, 'active', $3)")
                .bind(number)
                .bind(name)
                .bind(now_ms)
                .execute(&mut *tx)
                .await;
        match inserted {
            Ok(_) => {}
            Err(error) if is_unique_violation(&error) => continue,
            Err(error) => return Err(error.into()),
        }
        for (layout, table) in &lease_tables {
            insert_lease_table(&mut tx, number, layout, table, now_ms).await?;
        }
        let named: Vec<String> = lease_tables.iter().map(|(l, t)| format!("{l} {}", t.table)).collect();
        audit(&mut tx, now_ms, actor, "add_region", &format!("{name} = {number}; {}", named.join(", "))).await?;
        match tx.commit().await {
            Ok(()) => {
                return Ok(Region {
                    name: name.to_owned(),
                    number: number as u32,
                    status: RegionStatus::Active,
                    created_at_ms: now_ms,
                    retired_at_ms: None,
                    retires_at_ms: None,
                    lease_tables,
                });
            }
            Err(error) if is_unique_violation(&error) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(RegistryError::ScheduleConflict { what: "too much contention adding a region; try again".into() })
}

/// [`RegistryStore::retire_region`](crate::store::RegistryStore::retire_region) on this driver.
pub async fn retire_region(
    pool: &sqlx::Pool<Db>,
    name: &str,
    at_ms: Option<i64>,
    actor: &str,
    now_ms: i64,
    lead_ms: i64,
) -> Result<Region, RegistryError> {
    let mut tx = pool.begin().await?;
    // The state row first, as `add_layout` takes it: a layout scheduled at the same time is
    // seen here, or sees this retirement.
    let schedule = read_schedule(&mut tx, now_ms, lead_ms).await?;
    settle_retirements(&mut tx, now_ms).await?;
    let region = lock_active_region(&mut tx, name, now_ms).await?;
    if let (Some(pending), Some(_)) = (region.retires_at_ms, at_ms) {
        return Err(RegistryError::RetirePending { name: name.to_owned(), at_ms: pending });
    }
    if name == schedule.home_region
        && let Some((entry, end)) = schedule.home_only_layout(now_ms)
    {
        let text = |ms: u64| idgen_core::format_unix_ms(ms as i64 + idgen_core::EPOCH_UNIX_MS);
        let when = match (entry.from_ms <= since_epoch(now_ms), end) {
            (true, Some(end)) => format!("is in force until {}", text(end)),
            (true, None) => "is in force, with no end".to_owned(),
            (false, Some(end)) => format!("is scheduled from {} until {}", text(entry.from_ms), text(end)),
            (false, None) => format!("is scheduled from {}, with no end", text(entry.from_ms)),
        };
        return Err(RegistryError::HomeRegionInUse(format!(
            "{name} is the home region, the only region that issues under layout {layout} (no region bits), \
             which {when}: retiring it would stop every ID meanwhile. Retire it once {layout} is over",
            layout = entry.layout.name()
        )));
    }
    let number = i64::from(region.number);
    let region = match at_ms {
        None => {
            sqlx::query(
                "UPDATE regions SET status = 'retired', retired_at_ms = $1, retires_at_ms = $1 WHERE number = $2",
            )
            .bind(now_ms)
            .bind(number)
            .execute(&mut *tx)
            .await?;
            audit(&mut tx, now_ms, actor, "retire_region", &format!("{name} = {number}")).await?;
            Region { status: RegionStatus::Retired, retired_at_ms: Some(now_ms), retires_at_ms: None, ..region }
        }
        Some(at) => {
            sqlx::query("UPDATE regions SET retires_at_ms = $1 WHERE number = $2")
                .bind(at)
                .bind(number)
                .execute(&mut *tx)
                .await?;
            let detail = format!("{name} = {number} at {}", idgen_core::format_unix_ms(at));
            audit(&mut tx, now_ms, actor, "schedule_retire", &detail).await?;
            Region { retires_at_ms: Some(at), ..region }
        }
    };
    tx.commit().await?;
    Ok(region)
}

/// [`RegistryStore::cancel_retire`](crate::store::RegistryStore::cancel_retire) on this driver.
pub async fn cancel_retire(
    pool: &sqlx::Pool<Db>,
    name: &str,
    actor: &str,
    now_ms: i64,
) -> Result<Region, RegistryError> {
    let mut tx = pool.begin().await?;
    settle_retirements(&mut tx, now_ms).await?;
    let region = match lock_active_region(&mut tx, name, now_ms).await {
        Err(RegistryError::UnknownRegion(_)) => {
            let retired = sqlx::query(
                "SELECT retired_at_ms FROM regions WHERE name = $1 AND status = 'retired' \
                 ORDER BY number DESC LIMIT 1",
            )
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
            return Err(match retired {
                Some(row) => RegistryError::AlreadyRetired {
                    name: name.to_owned(),
                    at_ms: row.try_get::<Option<i64>, _>("retired_at_ms")?.unwrap_or_default(),
                },
                None => RegistryError::UnknownRegion(name.to_owned()),
            });
        }
        other => other?,
    };
    let Some(at) = region.retires_at_ms else {
        return Err(RegistryError::NoRetirementPending(name.to_owned()));
    };
    sqlx::query("UPDATE regions SET retires_at_ms = NULL WHERE number = $1")
        .bind(i64::from(region.number))
        .execute(&mut *tx)
        .await?;
    let detail = format!("{name} = {}, was to retire at {}", region.number, idgen_core::format_unix_ms(at));
    audit(&mut tx, now_ms, actor, "cancel_retire", &detail).await?;
    tx.commit().await?;
    Ok(Region { retires_at_ms: None, ..region })
}

/// [`RegistryStore::move_lease_table`](crate::store::RegistryStore::move_lease_table) on this driver.
#[allow(clippy::too_many_arguments)]
pub async fn move_lease_table(
    pool: &sqlx::Pool<Db>,
    name: &str,
    layout: &str,
    from: &str,
    to: &str,
    to_table_id: Option<&str>,
    actor: &str,
    now_ms: i64,
) -> Result<Region, RegistryError> {
    let mut tx = pool.begin().await?;
    settle_retirements(&mut tx, now_ms).await?;
    let region = lock_active_region(&mut tx, name, now_ms).await?;
    let number = i64::from(region.number);
    let mut tables = read_lease_tables(&mut *tx, Some(number)).await?.remove(&region.number).unwrap_or_default();
    let current = tables.get(layout).ok_or_else(|| RegistryError::UnknownLayout(layout.to_owned()))?;
    if current.table != from {
        return Err(RegistryError::LeaseTableMoved {
            name: name.to_owned(),
            layout: layout.to_owned(),
            from: from.to_owned(),
            current: current.table.clone(),
        });
    }
    let moved = LeaseTable {
        table: to.to_owned(),
        moved_from: Some(from.to_owned()),
        table_id: to_table_id.map(str::to_owned),
    };
    tables.insert(layout.to_owned(), moved);
    distinct_tables(name, &tables)?;
    sqlx::query(
        "UPDATE region_lease_tables SET table_name = $1, moved_from = $2, set_at_ms = $3, table_id = $6 \
         WHERE region_number = $4 AND layout = $5",
    )
    .bind(to)
    .bind(from)
    .bind(now_ms)
    .bind(number)
    .bind(layout)
    .bind(to_table_id)
    .execute(&mut *tx)
    .await?;
    let identity = to_table_id.map_or_else(|| " (identity recorded at its init)".to_owned(), |id| format!(" = {id}"));
    audit(&mut tx, now_ms, actor, "move_lease_table", &format!("{name} {layout}: {from} -> {to}{identity}")).await?;
    tx.commit().await?;
    Ok(Region { lease_tables: tables, ..region })
}

/// [`RegistryStore::record_lease_table`](crate::store::RegistryStore::record_lease_table) on this driver.
pub async fn record_lease_table(
    pool: &sqlx::Pool<Db>,
    name: &str,
    layout: &str,
    table: &str,
    table_id: &str,
    actor: &str,
    now_ms: i64,
) -> Result<(Region, bool), RegistryError> {
    let mut tx = pool.begin().await?;
    settle_retirements(&mut tx, now_ms).await?;
    let region = lock_active_region(&mut tx, name, now_ms).await?;
    let number = i64::from(region.number);
    let mut tables = read_lease_tables(&mut *tx, Some(number)).await?.remove(&region.number).unwrap_or_default();
    let current = tables.get_mut(layout).ok_or_else(|| RegistryError::UnknownLayout(layout.to_owned()))?;
    if current.table != table {
        return Err(RegistryError::LeaseTableMoved {
            name: name.to_owned(),
            layout: layout.to_owned(),
            from: table.to_owned(),
            current: current.table.clone(),
        });
    }
    match current.table_id.clone() {
        Some(recorded) if recorded == table_id => return Ok((Region { lease_tables: tables, ..region }, false)),
        Some(recorded) => {
            return Err(RegistryError::LeaseTableIdentity {
                name: name.to_owned(),
                layout: layout.to_owned(),
                table: table.to_owned(),
                recorded,
                offered: table_id.to_owned(),
            });
        }
        None => current.table_id = Some(table_id.to_owned()),
    }
    // Only over no identity: two first inits at once, of two tables, record one.
    let done = sqlx::query(
        "UPDATE region_lease_tables SET table_id = $1 \
         WHERE region_number = $2 AND layout = $3 AND table_name = $4 AND table_id IS NULL",
    )
    .bind(table_id)
    .bind(number)
    .bind(layout)
    .bind(table)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() != 1 {
        return Err(RegistryError::ScheduleConflict {
            what: format!("region {name}'s {layout} lease table changed while its identity was recorded; try again"),
        });
    }
    audit(&mut tx, now_ms, actor, "record_lease_table", &format!("{name} {layout}: {table} = {table_id}")).await?;
    tx.commit().await?;
    Ok((Region { lease_tables: tables, ..region }, true))
}

/// [`RegistryStore::report_number_in_use`](crate::store::RegistryStore::report_number_in_use) on this driver.
#[allow(clippy::too_many_arguments)]
pub async fn report_number_in_use(
    pool: &sqlx::Pool<Db>,
    number: u32,
    region: &str,
    registry_id: &str,
    issues_until_ms: i64,
    reporter: &str,
    now_ms: i64,
    lead_ms: i64,
) -> Result<Reported, RegistryError> {
    let mut tx = pool.begin().await?;
    let ours: Option<String> = sqlx::query("SELECT registry_id FROM schedule_state WHERE id = 1")
        .fetch_optional(&mut *tx)
        .await?
        .map(|row| row.try_get("registry_id"))
        .transpose()?
        .flatten();
    if ours.as_deref() == Some(registry_id) {
        return Ok(Reported::Nothing { why: "the reporter follows this registry".into() });
    }
    let until_ms = issues_until_ms.min(now_ms.saturating_add(lead_ms));
    if until_ms <= now_ms {
        return Ok(Reported::Nothing { why: "the reporter's copy lets it issue until a time already past".into() });
    }
    let holder = sqlx::query("SELECT name, status FROM regions WHERE number = $1")
        .bind(i64::from(number))
        .fetch_optional(&mut *tx)
        .await?;
    if let Some(row) = holder {
        let (name, status): (String, String) = (row.try_get("name")?, row.try_get("status")?);
        if name == region && status == "active" {
            return Ok(Reported::Nothing { why: format!("this registry has number {number} as {region} too") });
        }
        if status == "active" {
            return Ok(Reported::Conflict { region: name });
        }
        // A retired number is handed out to no one anyway.
        return Ok(Reported::Nothing { why: format!("number {number} is retired here, never handed out again") });
    }
    sqlx::query(
        "INSERT INTO numbers_in_use (number, region_name, registry_id, issues_until_ms, reporter, first_at_ms, \
         last_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $6) \
         ON CONFLICT (number) DO UPDATE SET region_name = excluded.region_name, registry_id = excluded.registry_id, \
         issues_until_ms = CASE WHEN numbers_in_use.issues_until_ms > excluded.issues_until_ms \
         THEN numbers_in_use.issues_until_ms ELSE excluded.issues_until_ms END, \
         reporter = excluded.reporter, last_at_ms = excluded.last_at_ms",
    )
    .bind(i64::from(number))
    .bind(region)
    .bind(registry_id)
    .bind(until_ms)
    .bind(reporter)
    .bind(now_ms)
    .execute(&mut *tx)
    .await?;
    let until_ms: i64 = sqlx::query("SELECT issues_until_ms FROM numbers_in_use WHERE number = $1")
        .bind(i64::from(number))
        .fetch_one(&mut *tx)
        .await?
        .try_get("issues_until_ms")?;
    tx.commit().await?;
    Ok(Reported::Withheld { until_ms })
}

/// [`RegistryStore::numbers_in_use`](crate::store::RegistryStore::numbers_in_use) on this driver.
pub async fn numbers_in_use<'c>(
    executor: impl sqlx::Executor<'c, Database = Db>,
    now_ms: i64,
) -> Result<Vec<NumberInUse>, RegistryError> {
    let rows = sqlx::query(
        "SELECT number, region_name, registry_id, issues_until_ms, reporter, last_at_ms FROM numbers_in_use \
         WHERE issues_until_ms > $1 ORDER BY number",
    )
    .bind(now_ms)
    .fetch_all(executor)
    .await?;
    rows.iter()
        .map(|row| {
            let number: i64 = row.try_get("number")?;
            Ok(NumberInUse {
                number: u32::try_from(number).map_err(|_| RegistryError::Invalid(format!("number in use {number}")))?,
                region: row.try_get("region_name")?,
                registry_id: row.try_get("registry_id")?,
                until_ms: row.try_get("issues_until_ms")?,
                reporter: row.try_get("reporter")?,
                last_at_ms: row.try_get("last_at_ms")?,
            })
        })
        .collect()
}

/// Makes every retirement whose time has come permanent (`status = 'retired'`), so that a write's
/// checks, and the unique index on active names, see it. Every write transaction starts with it;
/// reads leave it be and compute the status from the time ([`region_row`]).
pub(super) async fn settle_retirements(tx: &mut sqlx::Transaction<'_, Db>, now_ms: i64) -> Result<(), RegistryError> {
    sqlx::query(
        "UPDATE regions SET status = 'retired', retired_at_ms = retires_at_ms \
         WHERE status = 'active' AND retires_at_ms <= $1",
    )
    .bind(now_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The active region of that name, its row locked until the transaction ends (a no-op update:
/// SQL both databases accept), so that a concurrent retire or cancel waits and then sees this
/// one's result.
async fn lock_active_region(
    tx: &mut sqlx::Transaction<'_, Db>,
    name: &str,
    now_ms: i64,
) -> Result<Region, RegistryError> {
    let row = sqlx::query(&format!(
        "UPDATE regions SET status = status WHERE name = $1 AND status = 'active' RETURNING {REGION_COLUMNS}"
    ))
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?;
    region_row(&row.ok_or_else(|| RegistryError::UnknownRegion(name.to_owned()))?, now_ms)
}

/// The lease tables, by region number and layout (of one region, or all).
async fn read_lease_tables<'c>(
    executor: impl sqlx::Executor<'c, Database = Db>,
    region_number: Option<i64>,
) -> Result<BTreeMap<u32, BTreeMap<String, LeaseTable>>, RegistryError> {
    const SELECT: &str = "SELECT region_number, layout, table_name, moved_from, table_id FROM region_lease_tables";
    let rows = match region_number {
        Some(number) => {
            sqlx::query(&format!("{SELECT} WHERE region_number = $1")).bind(number).fetch_all(executor).await?
        }
        None => sqlx::query(SELECT).fetch_all(executor).await?,
    };
    let mut tables: BTreeMap<u32, BTreeMap<String, LeaseTable>> = BTreeMap::new();
    for row in &rows {
        let number: i64 = row.try_get("region_number")?;
        let number = u32::try_from(number).map_err(|_| RegistryError::Invalid(format!("region number {number}")))?;
        tables.entry(number).or_default().insert(
            row.try_get("layout")?,
            LeaseTable {
                table: row.try_get("table_name")?,
                moved_from: row.try_get("moved_from")?,
                table_id: row.try_get("table_id")?,
            },
        );
    }
    Ok(tables)
}

async fn insert_lease_table(
    tx: &mut sqlx::Transaction<'_, Db>,
    region_number: i64,
    layout: &str,
    table: &LeaseTable,
    now_ms: i64,
) -> Result<(), RegistryError> {
    sqlx::query(
        "INSERT INTO region_lease_tables (region_number, layout, table_name, moved_from, set_at_ms, table_id) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(region_number)
    .bind(layout)
    .bind(&table.table)
    .bind(&table.moved_from)
    .bind(now_ms)
    .bind(&table.table_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
