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
    /// Register a region: it gets the lowest number never used.
    Add { name: String },
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
            RegionsCommand::Add { name } => {
                self.call(reqwest::Method::POST, "/v1/regions", Some(json!({ "name": name }))).await?
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
                let mut table = Table::new(&["NUMBER", "STATUS", "CREATED", "RETIRES", "NAME"]).right(&[0]);
                for region in body["regions"].as_array().into_iter().flatten() {
                    table.row([
                        text(&region["number"]),
                        text(&region["status"]),
                        text(&region["created_at"]),
                        // A dash, not an empty cell: the columns stay readable (and parseable) by eye.
                        region["retires_at"].as_str().unwrap_or("-").to_owned(),
                        text(&region["name"]),
                    ]);
                }
                table.print();
                println!(
                    "{} of {} region numbers left (retired numbers are never reused)",
                    body["numbers_left"], body["numbers_total"]
                );
            }
            RegionsCommand::Add { .. } => {
                println!("region {} has number {}", body["name"].as_str().unwrap_or(""), body["number"])
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
