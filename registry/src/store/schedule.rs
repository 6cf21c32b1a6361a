//! The schedule: the layouts and the horizon, published once by `init` ([`seed`]) and then only
//! added to. Written once, in SQL both databases accept, and compiled for each database's own
//! driver (`super::Db`).
//!
//! Never: changes or removes a layout once added, moves the horizon back, or answers a horizon
//! past a cutover the answer lacks.

use idgen_core::{Layout, MAX_TIMESTAMP};
use idgen_server::database::is_unique_violation;
use sqlx::Row;

use super::Db;
use super::audit::audit;
use super::regions::settle_retirements;
use crate::store::{
    InitialSchedule, Initialized, RegistryError, ScheduleView, ScheduledLayout, another_home_region, horizon_for,
};

pub async fn seed(pool: &sqlx::Pool<Db>, initial: &InitialSchedule) -> Result<Initialized, RegistryError> {
    let mut tx = pool.begin().await?;
    let seeded: i64 =
        sqlx::query("SELECT COUNT(*) AS n FROM schedule_state").fetch_one(&mut *tx).await?.try_get("n")?;
    if seeded == 0 {
        // The registry's identity: made here, once, and never again for this database.
        sqlx::query(
            "INSERT INTO schedule_state (id, horizon_ms, home_region, registry_id, initialized_at_ms) \
             VALUES (1, 0, $1, $2, $3)",
        )
        .bind(&initial.home_region)
        .bind(format!("{:032x}", rand::random::<u128>()))
        .bind(idgen::system_unix_ms())
        .execute(&mut *tx)
        .await?;
        for entry in &initial.layouts {
            insert_layout(&mut tx, entry, 0).await?;
        }
        return match tx.commit().await {
            Ok(()) => Ok(Initialized::Now),
            // Another `init` seeded it first: what it published is checked like any other.
            Err(error) if is_unique_violation(&error) => Box::pin(seed(pool, initial)).await,
            Err(error) => Err(error.into()),
        };
    }
    // Published once, the home region and the first layouts never change.
    let home: String = sqlx::query("SELECT home_region FROM schedule_state WHERE id = 1")
        .fetch_one(&mut *tx)
        .await?
        .try_get("home_region")?;
    if home != initial.home_region {
        return Err(RegistryError::NotARegistry(another_home_region(&home, &initial.home_region)));
    }
    let regions: i64 = sqlx::query("SELECT COUNT(*) AS n FROM regions").fetch_one(&mut *tx).await?.try_get("n")?;
    Ok(Initialized::Already { home_region: home, regions: regions as u64 })
}

/// [`RegistryStore::ping`](crate::store::RegistryStore::ping) on this driver.
pub async fn ping(pool: &sqlx::Pool<Db>) -> Result<(), RegistryError> {
    let row = sqlx::query("SELECT horizon_ms FROM schedule_state WHERE id = 1").fetch_optional(pool).await?;
    match row {
        Some(_) => Ok(()),
        None => Err(RegistryError::Invalid("the registry's schedule state is missing".into())),
    }
}

/// [`RegistryStore::schedule`](crate::store::RegistryStore::schedule) on this driver.
pub async fn schedule(pool: &sqlx::Pool<Db>, now_unix_ms: i64, lead_ms: i64) -> Result<ScheduleView, RegistryError> {
    let state = sqlx::query("SELECT horizon_ms, home_region, registry_id FROM schedule_state WHERE id = 1")
        .fetch_one(pool)
        .await?;
    let horizon_ms = state.try_get::<i64, _>("horizon_ms")? as u64;
    if horizon_ms < horizon_for(now_unix_ms, lead_ms / 2) {
        let mut tx = pool.begin().await?;
        let view = read_schedule(&mut tx, now_unix_ms, lead_ms).await?;
        tx.commit().await?;
        return Ok(view);
    }
    let layouts = read_layouts(pool).await?;
    Ok(ScheduleView {
        layouts,
        horizon_ms,
        home_region: state.try_get("home_region")?,
        registry_id: registry_id(&state)?,
    })
}

/// [`RegistryStore::advance_horizon`](crate::store::RegistryStore::advance_horizon) on this driver.
pub async fn advance_horizon(pool: &sqlx::Pool<Db>, now_unix_ms: i64, lead_ms: i64) -> Result<u64, RegistryError> {
    let mut tx = pool.begin().await?;
    let view = read_schedule(&mut tx, now_unix_ms, lead_ms).await?;
    tx.commit().await?;
    Ok(view.horizon_ms)
}

/// [`RegistryStore::add_layout`](crate::store::RegistryStore::add_layout) on this driver.
pub async fn add_layout(
    pool: &sqlx::Pool<Db>,
    entry: ScheduledLayout,
    actor: &str,
    now_unix_ms: i64,
    lead_ms: i64,
) -> Result<ScheduledLayout, RegistryError> {
    // Validation and insert happen in one transaction that first updates (and so locks) the
    // state row: a concurrent reader, which advances the horizon through the same row, waits
    // and then sees the new layout. No generator can be handed a horizon past a cutover it
    // was not told about.
    let mut tx = pool.begin().await?;
    let current = read_schedule(&mut tx, now_unix_ms, lead_ms).await?;
    settle_retirements(&mut tx, now_unix_ms).await?;
    let conflict = |what: String| Err(RegistryError::ScheduleConflict { what });
    if current.layouts.iter().any(|l| l.layout.name() == entry.layout.name()) {
        return Err(RegistryError::LayoutExists(entry.layout.name().to_owned()));
    }
    if entry.from_ms > MAX_TIMESTAMP {
        return conflict(format!("from {} ms is past the last representable timestamp", entry.from_ms));
    }
    if entry.from_ms < current.horizon_ms {
        return conflict(format!(
            "from {} must be at or after the published horizon {}",
            idgen_core::format_unix_ms(entry.from_ms as i64 + idgen_core::EPOCH_UNIX_MS),
            idgen_core::format_unix_ms(current.horizon_ms.min(MAX_TIMESTAMP) as i64 + idgen_core::EPOCH_UNIX_MS)
        ));
    }
    if let Some(last) = current.layouts.last().filter(|last| entry.from_ms <= last.from_ms) {
        return conflict(format!(
            "from must be strictly after the last layout {} (from_ms {})",
            last.layout.name(),
            last.from_ms
        ));
    }
    if entry.layout.region_bits() > 0 {
        let max = i64::from(entry.layout.max_region());
        let row = sqlx::query(
            "SELECT name, number FROM regions WHERE status = 'active' AND number > $1 ORDER BY number LIMIT 1",
        )
        .bind(max)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = row {
            let (name, number): (String, i64) = (row.try_get("name")?, row.try_get("number")?);
            return conflict(format!(
                "active region {name} has number {number}, which {} bits of region cannot carry",
                entry.layout.region_bits()
            ));
        }
    }
    if entry.layout.region_bits() == 0 {
        // Only the home region issues under it: one retired, or retiring, would leave none.
        let home = &current.home_region;
        let rows = sqlx::query("SELECT status, retires_at_ms FROM regions WHERE name = $1")
            .bind(home)
            .fetch_all(&mut *tx)
            .await?;
        let mut active = None;
        for row in &rows {
            if row.try_get::<String, _>("status")? == "active" {
                active = Some(row.try_get::<Option<i64>, _>("retires_at_ms")?);
            }
        }
        match active {
            Some(Some(at)) => {
                return conflict(format!(
                    "the home region {home} retires at {}, and only the home region issues under a layout \
                     without region bits: cancel that retirement first",
                    idgen_core::format_unix_ms(at)
                ));
            }
            None if !rows.is_empty() => {
                return conflict(format!(
                    "the home region {home} is retired, and only the home region issues under a layout \
                     without region bits"
                ));
            }
            _ => {}
        }
    }
    match insert_layout(&mut tx, &entry, now_unix_ms).await {
        Ok(()) => {}
        Err(RegistryError::Storage(error)) if is_unique_violation(&error) => {
            return Err(RegistryError::LayoutExists(entry.layout.name().to_owned()));
        }
        Err(error) => return Err(error),
    }
    // Every active region's generators will claim under it in its default table.
    sqlx::query(
        "INSERT INTO region_lease_tables (region_number, layout, table_name, set_at_ms) \
         SELECT number, $1, $2, $3 FROM regions WHERE status = 'active'",
    )
    .bind(entry.layout.name())
    .bind(idgen::lease::default_table(entry.layout.name()))
    .bind(now_unix_ms)
    .execute(&mut *tx)
    .await?;
    let l = &entry.layout;
    let detail = format!(
        "{} = {}+{}+{} from_ms {}",
        l.name(),
        l.region_bits(),
        l.machine_bits(),
        l.sequence_bits(),
        entry.from_ms
    );
    audit(&mut tx, now_unix_ms, actor, "add_layout", &detail).await?;
    tx.commit().await?;
    Ok(entry)
}

/// The schedule inside a transaction: the state row is updated first (advancing the horizon to
/// at least `now + lead`, never back), which locks it until the transaction ends.
pub(super) async fn read_schedule(
    tx: &mut sqlx::Transaction<'_, Db>,
    now_unix_ms: i64,
    lead_ms: i64,
) -> Result<ScheduleView, RegistryError> {
    let wanted = horizon_for(now_unix_ms, lead_ms) as i64;
    sqlx::query(
        "UPDATE schedule_state SET horizon_ms = CASE WHEN horizon_ms < $1 THEN $1 ELSE horizon_ms END WHERE id = 1",
    )
    .bind(wanted)
    .execute(&mut **tx)
    .await?;
    let state = sqlx::query("SELECT horizon_ms, home_region, registry_id FROM schedule_state WHERE id = 1")
        .fetch_one(&mut **tx)
        .await?;
    let layouts = read_layouts(&mut **tx).await?;
    let horizon_ms: i64 = state.try_get("horizon_ms")?;
    Ok(ScheduleView {
        layouts,
        horizon_ms: horizon_ms as u64,
        home_region: state.try_get("home_region")?,
        registry_id: registry_id(&state)?,
    })
}

/// Every scheduled layout, in the order they start.
pub(super) async fn read_layouts<'c>(
    executor: impl sqlx::Executor<'c, Database = Db>,
) -> Result<Vec<ScheduledLayout>, RegistryError> {
    let rows =
        sqlx::query("SELECT name, region_bits, machine_bits, sequence_bits, from_ms FROM layouts ORDER BY from_ms")
            .fetch_all(executor)
            .await?;
    let mut layouts = Vec::new();
    for row in &rows {
        let bits = |name: &str| -> Result<u8, RegistryError> {
            let value: i64 = row.try_get(name)?;
            u8::try_from(value).map_err(|_| RegistryError::Invalid(format!("{name} = {value}")))
        };
        let layout = Layout::new(
            row.try_get::<String, _>("name")?,
            bits("region_bits")?,
            bits("machine_bits")?,
            bits("sequence_bits")?,
        )
        .map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let from_ms: i64 = row.try_get("from_ms")?;
        layouts.push(ScheduledLayout { layout, from_ms: from_ms as u64 });
    }
    Ok(layouts)
}

async fn insert_layout(
    tx: &mut sqlx::Transaction<'_, Db>,
    entry: &ScheduledLayout,
    now_ms: i64,
) -> Result<(), RegistryError> {
    let l = &entry.layout;
    sqlx::query(
        "INSERT INTO layouts (name, region_bits, machine_bits, sequence_bits, from_ms, created_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(l.name())
    .bind(i64::from(l.region_bits()))
    .bind(i64::from(l.machine_bits()))
    .bind(i64::from(l.sequence_bits()))
    .bind(entry.from_ms as i64)
    .bind(now_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn registry_id(state: &<Db as sqlx::Database>::Row) -> Result<String, RegistryError> {
    state
        .try_get::<Option<String>, _>("registry_id")?
        .ok_or_else(|| RegistryError::Invalid("the registry has no identity: run `idgen registry init`".into()))
}
