//! `idgen regions …` and `idgen layouts …`: the registry's operator commands, over its HTTP API.
//! Reads need nothing; writes send the operator token (`--token`, `IDGEN_OPERATOR_TOKEN`, or the
//! file `idgen up` writes, `./.idgen/operator-token`), or come from an operator named by its
//! client certificate (`--cert`/`--key`, with `--cacert` for an https registry).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::table::{Table, text};

#[derive(Args, Debug)]
pub struct Registry {
    /// The registry's base URL.
    #[arg(long, global = true, env = "IDGEN_REGISTRY_URL", default_value = "http://127.0.0.1:8700", value_parser = crate::registry_url)]
    pub registry: String,
    /// Operator token for writes (default: IDGEN_OPERATOR_TOKEN, then ./.idgen/operator-token).
    #[arg(long, global = true, env = "IDGEN_OPERATOR_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[arg(long, global = true, default_value = ".idgen/operator-token")]
    token_file: PathBuf,
    /// JSON instead of human-readable output.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub tls: crate::tls::ClientTls,
}

#[derive(Subcommand, Debug)]
pub enum RegionsCommand {
    /// Every region with its number and status, and how many numbers are left.
    List,
    /// Register a region: it gets the lowest number never used, and its lease tables (the
    /// defaults, `idgen-leases` for v1 and `idgen-leases-<layout>` for the others, unless named).
    Add {
        name: String,
        /// A lease table other than the default, as LAYOUT=TABLE (repeatable), e.g.
        /// v2=idgen-leases-v2-eu.
        #[arg(long = "lease-table", value_name = "LAYOUT=TABLE", value_parser = layout_table)]
        lease_tables: Vec<(String, String)>,
    },
    /// Move the region's lease table for one layout to another table: the step that goes with
    /// `idgen leases adopt` (runbooks/lease-table-restore.md). The region's generators claim in
    /// the new table only once it was adopted from the one it replaces.
    MoveLeaseTable {
        name: String,
        /// The region's name once more: a typo in either is refused.
        #[arg(long, value_name = "NAME")]
        confirm: String,
        #[arg(long)]
        layout: String,
        /// The table the region names now.
        #[arg(long)]
        from: String,
        /// The adopted table it moves to.
        #[arg(long)]
        to: String,
        /// The adopted table's genesis id (`idgen leases adopt` prints it); without it, the
        /// table's next `idgen leases init` records it.
        #[arg(long)]
        table_id: Option<String>,
    },
    /// Retire a region: its workers stop issuing at a time no earlier than the registry's grace
    /// from now (24 h in production), cancellable until then; its number is never handed out
    /// again.
    Retire {
        name: String,
        /// The region's name once more: a typo in either is refused.
        #[arg(long, value_name = "NAME")]
        confirm: String,
        /// When it takes effect, UTC, e.g. 2030-01-01T00:00:00Z: later than the grace if wanted,
        /// never earlier.
        #[arg(long, value_name = "TIME", conflicts_with = "now")]
        at: Option<String>,
        /// At once: only for a region that is already dead (no worker of it issues).
        #[arg(long)]
        now: bool,
    },
    /// Cancel a region's scheduled retirement, while its time is ahead.
    CancelRetire {
        name: String,
        /// The region's name once more: a typo in either is refused.
        #[arg(long, value_name = "NAME")]
        confirm: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum LayoutsCommand {
    /// The schedule: layouts, when each starts, the horizon and the home region.
    Show,
    /// Schedule a new layout; its start must be at or after the horizon.
    Schedule {
        name: String,
        #[arg(long)]
        region_bits: u8,
        #[arg(long)]
        machine_bits: u8,
        #[arg(long)]
        sequence_bits: u8,
        /// When it starts, UTC, e.g. 2030-01-01T00:00:00Z.
        #[arg(long)]
        from: String,
    },
}

/// The layouts of a `GET /v1/layouts` answer, as a table (`layouts show`, `status`).
pub fn layouts_table(schedule: &Value) -> Table {
    let mut table = Table::new(&["LAYOUT", "REGION", "MACHINE", "SEQUENCE", "FROM"]).right(&[1, 2, 3]);
    for layout in schedule["layouts"].as_array().into_iter().flatten() {
        table.row([
            text(&layout["name"]),
            text(&layout["region_bits"]),
            text(&layout["machine_bits"]),
            text(&layout["sequence_bits"]),
            text(&layout["from"]),
        ]);
    }
    table
}

impl Registry {
    fn token(&self) -> anyhow::Result<String> {
        if let Some(token) = &self.token {
            return Ok(token.clone());
        }
        let text = std::fs::read_to_string(&self.token_file).with_context(|| {
            format!("no --token or IDGEN_OPERATOR_TOKEN, and {} cannot be read", self.token_file.display())
        })?;
        Ok(text.trim().to_owned())
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let http = self.tls.client()?;
        let mut request = http.request(method.clone(), format!("{}{path}", self.registry.trim_end_matches('/')));
        if method != reqwest::Method::GET {
            match self.token() {
                Ok(token) => request = request.bearer_auth(token),
                // An operator may be named by its client certificate instead.
                Err(_) if self.tls.cert.is_some() => {}
                Err(error) => return Err(error),
            }
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.with_context(|| format!("reaching the registry at {}", self.registry))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{status}: {}", body["error"]["message"].as_str().unwrap_or("(no message)"));
        }
        Ok(body)
    }

    pub async fn regions(&self, command: RegionsCommand) -> anyhow::Result<()> {
        let body = match &command {
            RegionsCommand::List => self.call(reqwest::Method::GET, "/v1/regions", None).await?,
            RegionsCommand::Add { name, lease_tables } => {
                let mut request = json!({ "name": name });
                if !lease_tables.is_empty() {
                    let tables: serde_json::Map<String, Value> =
                        lease_tables.iter().map(|(layout, table)| (layout.clone(), json!(table))).collect();
                    request["lease_tables"] = Value::Object(tables);
                }
                self.call(reqwest::Method::POST, "/v1/regions", Some(request)).await?
            }
            RegionsCommand::MoveLeaseTable { name, confirm, layout, from, to, table_id } => {
                let mut request = json!({ "confirm": confirm, "layout": layout, "from": from, "to": to });
                if let Some(id) = table_id {
                    request["table_id"] = json!(id);
                }
                self.call(reqwest::Method::POST, &format!("/v1/regions/{name}:move-lease-table"), Some(request)).await?
            }
            RegionsCommand::Retire { name, confirm, at, now } => {
                let mut request = json!({ "confirm": confirm });
                if let Some(at) = at {
                    request["at"] = json!(at);
                }
                if *now {
                    request["now"] = json!(true);
                }
                self.call(reqwest::Method::POST, &format!("/v1/regions/{name}:retire"), Some(request)).await?
            }
            RegionsCommand::CancelRetire { name, confirm } => {
                let request = json!({ "confirm": confirm });
                self.call(reqwest::Method::POST, &format!("/v1/regions/{name}:cancel-retire"), Some(request)).await?
            }
        };
        if self.json {
            println!("{body}");
            return Ok(());
        }
        match command {
            RegionsCommand::List => {
                let mut table =
                    Table::new(&["NUMBER", "STATUS", "CREATED", "RETIRES", "NAME", "LEASE TABLES"]).right(&[0]);
                for region in body["regions"].as_array().into_iter().flatten() {
                    table.row([
                        text(&region["number"]),
                        text(&region["status"]),
                        text(&region["created_at"]),
                        // A dash, not an empty cell: the columns stay readable (and parseable) by eye.
                        region["retires_at"].as_str().unwrap_or("-").to_owned(),
                        text(&region["name"]),
                        lease_tables(region),
                    ]);
                }
                table.print();
                println!(
                    "{} of {} region numbers left (retired numbers are never reused)",
                    body["numbers_left"], body["numbers_total"]
                );
            }
            RegionsCommand::Add { .. } => {
                println!(
                    "region {} has number {}; lease tables: {}",
                    body["name"].as_str().unwrap_or(""),
                    body["number"],
                    lease_tables(&body)
                )
            }
            RegionsCommand::MoveLeaseTable { layout, to, .. } => {
                let name = body["name"].as_str().unwrap_or("");
                println!(
                    "region {name}'s lease table for {layout} is now {to} (its generators claim there once it is \
                     adopted); lease tables: {}",
                    lease_tables(&body)
                )
            }
            RegionsCommand::Retire { .. } => {
                let name = body["name"].as_str().unwrap_or("");
                match body["retires_at"].as_str() {
                    Some(at) => println!(
                        "region {name} retires at {at}: its workers issue until then and stop at that time; \
                         number {} will never be reused. Until then: idgen regions cancel-retire {name} --confirm {name}",
                        body["number"]
                    ),
                    None => println!("region {name} retired; number {} will never be reused", body["number"]),
                }
            }
            RegionsCommand::CancelRetire { .. } => {
                let name = body["name"].as_str().unwrap_or("");
                println!("region {name}: retirement cancelled; it stays active (number {})", body["number"])
            }
        }
        Ok(())
    }

    pub async fn layouts(&self, command: LayoutsCommand) -> anyhow::Result<()> {
        let body = match command {
            LayoutsCommand::Show => self.call(reqwest::Method::GET, "/v1/layouts", None).await?,
            LayoutsCommand::Schedule { name, region_bits, machine_bits, sequence_bits, from } => {
                let request = json!({"name": name, "region_bits": region_bits, "machine_bits": machine_bits, "sequence_bits": sequence_bits, "from": from});
                self.call(reqwest::Method::POST, "/v1/layouts", Some(request)).await?
            }
        };
        if self.json {
            println!("{body}");
            return Ok(());
        }
        layouts_table(&body).print();
        println!(
            "horizon {} (no cutover before it); home region {}",
            body["horizon"].as_str().unwrap_or(""),
            body["home_region"].as_str().unwrap_or("")
        );
        Ok(())
    }
}

/// `LAYOUT=TABLE`, as `regions add --lease-table` takes it.
fn layout_table(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((layout, table)) if !layout.is_empty() && !table.is_empty() => Ok((layout.to_owned(), table.to_owned())),
        _ => Err(format!("{text:?}: give LAYOUT=TABLE, e.g. v2=idgen-leases-v2-eu")),
    }
}

/// A region's lease tables, as one line: `v1 idgen-leases, v2 idgen-leases-v2 (moved from …)`.
fn lease_tables(region: &Value) -> String {
    let tables: Vec<String> = region["lease_tables"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(layout, entry)| {
            let moved = entry["moved_from"].as_str().map(|from| format!(" (moved from {from})")).unwrap_or_default();
            format!("{layout} {}{moved}", entry["table"].as_str().unwrap_or(""))
        })
        .collect();
    if tables.is_empty() { "-".to_owned() } else { tables.join(", ") }
}
