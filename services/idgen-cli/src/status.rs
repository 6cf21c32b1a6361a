//! `idgen status`: one screen of a platform — the registry, the schedule and its horizon, every
//! region, and each worker's health (the reason when it refuses) and the leases it holds — read
//! from the endpoints that already exist (`/healthz`, `/v1/regions`, `/v1/layouts`). The local
//! platform is the one `idgen up` wrote to `<dir>/up.json`; another is named with `--registry`
//! and `--worker REGION=URL` (a worker, or a region fleet's load balancer).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::{Value, json};

use crate::table::{Table, text};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The registry's base URL (default: the one `idgen up` started, from <dir>/up.json).
    #[arg(long, env = "IDGEN_REGISTRY_URL", value_parser = crate::registry_url)]
    registry: Option<String>,
    /// A worker to ask, as REGION=URL; repeatable (default: the workers in <dir>/up.json).
    #[arg(long = "worker", value_name = "REGION=URL")]
    workers: Vec<String>,
    /// Where `idgen up` keeps its files.
    #[arg(long, default_value = ".idgen")]
    dir: PathBuf,
    /// One JSON object instead of the screen.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    tls: crate::tls::ClientTls,
}

/// One endpoint's answer: its HTTP status and JSON body, or why there was none.
async fn get(http: &reqwest::Client, url: &str) -> Result<(u16, Value), String> {
    let response = http.get(url).send().await.map_err(|e| format!("unreachable: {e}"))?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Value::Null)))
}

fn error_of(answer: &Result<(u16, Value), String>) -> Option<String> {
    match answer {
        Ok((status, _)) if (200..300).contains(status) => None,
        Ok((status, body)) => {
            Some(format!("{status}: {}", body["error"]["message"].as_str().unwrap_or("(no message)")))
        }
        Err(error) => Some(error.clone()),
    }
}

/// Prints the platform's status; `Ok(false)` when anything is down or refusing (exit 1).
pub async fn run(args: StatusArgs) -> anyhow::Result<bool> {
    let (registry, workers) = match &args.registry {
        Some(url) => (url.trim_end_matches('/').to_owned(), parse_workers(&args.workers)?),
        None => {
            let file = args.dir.join("up.json");
            let saved = std::fs::read_to_string(&file).with_context(|| {
                format!(
                    "no platform to show: {} is missing (start one with `idgen up`, or name one with --registry)",
                    file.display()
                )
            })?;
            let up: Value = serde_json::from_str(&saved).with_context(|| format!("reading {}", file.display()))?;
            let mut workers: Vec<(String, String)> =
                up["workers"].as_array().into_iter().flatten().map(|w| (text(&w["region"]), text(&w["url"]))).collect();
            workers.extend(parse_workers(&args.workers)?);
            (text(&up["registry"]), workers)
        }
    };
    let http = args.tls.client_with_timeout(Duration::from_secs(5))?;
    let health = get(&http, &format!("{registry}/healthz")).await;
    let regions = get(&http, &format!("{registry}/v1/regions")).await;
    let layouts = get(&http, &format!("{registry}/v1/layouts")).await;
    let mut answers = Vec::new();
    for (region, url) in &workers {
        answers.push((
            region.clone(),
            url.clone(),
            get(&http, &format!("{}/healthz", url.trim_end_matches('/'))).await,
        ));
    }

    let registry_error = error_of(&health).or_else(|| error_of(&regions)).or_else(|| error_of(&layouts));
    let worker_json: Vec<Value> = answers
        .iter()
        .map(|(region, url, answer)| match answer {
            Ok((status, body)) => json!({
                "region": region, "url": url, "http_status": status,
                "status": body["status"].as_str().unwrap_or("unknown"),
                "reason": body.get("reason"), "message": body.get("message"),
                "holder": body.get("holder"), "leases": body.get("leases").cloned().unwrap_or(json!([])),
            }),
            Err(error) => json!({"region": region, "url": url, "status": "unreachable", "message": error}),
        })
        .collect();
    // A worker on standby (not the home region, before its layout) refuses by design: not down.
    let healthy =
        registry_error.is_none() && worker_json.iter().all(|w| w["status"] == "ok" || w["status"] == "standby");
    if args.json {
        let body =
            |answer: &Result<(u16, Value), String>| answer.as_ref().map(|(_, b)| b.clone()).unwrap_or(Value::Null);
        println!(
            "{}",
            json!({
                "healthy": healthy,
                "registry": {"url": registry, "status": if registry_error.is_none() { "ok" } else { "down" }, "error": registry_error},
                "schedule": body(&layouts),
                "regions": body(&regions),
                "workers": worker_json,
            })
        );
        return Ok(healthy);
    }

    match &registry_error {
        None => println!("registry {registry}: ok"),
        Some(error) => println!("registry {registry}: DOWN ({error})"),
    }
    if let Ok((200, schedule)) = &layouts {
        println!(
            "schedule: home region {}, horizon {} (no cutover before it)",
            text(&schedule["home_region"]),
            text(&schedule["horizon"])
        );
        crate::control::layouts_table(schedule).print();
    }
    if let Ok((200, body)) = &regions {
        println!();
        let mut table = Table::new(&["NUMBER", "REGION", "STATUS", "WORKERS", "ISSUING"]).right(&[0, 3, 4]);
        for region in body["regions"].as_array().into_iter().flatten() {
            let name = text(&region["name"]);
            let mine: Vec<&Value> = worker_json.iter().filter(|w| w["region"] == name.as_str()).collect();
            let issuing = mine.iter().filter(|w| w["status"] == "ok").count();
            table.row([
                text(&region["number"]),
                name,
                match region["retires_at"].as_str() {
                    Some(at) => format!("{}, retires {at}", text(&region["status"])),
                    None => text(&region["status"]),
                },
                mine.len().to_string(),
                issuing.to_string(),
            ]);
        }
        table.print();
        println!(
            "{} of {} region numbers left (retired numbers are never reused)",
            body["numbers_left"], body["numbers_total"]
        );
    }
    if !worker_json.is_empty() {
        println!();
        let mut table = Table::new(&["REGION", "WORKER", "STATUS", "LEASES", "REASON"]);
        for worker in &worker_json {
            let leases: Vec<String> = worker["leases"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|l| {
                    format!(
                        "{} machine {} ({} s left)",
                        text(&l["layout"]),
                        text(&l["machine"]),
                        l["issuing_for_ms"].as_i64().unwrap_or(0).max(0) / 1000
                    )
                })
                .collect();
            let reason =
                match (worker.get("reason").filter(|r| !r.is_null()), worker.get("message").filter(|m| !m.is_null())) {
                    (Some(reason), Some(message)) => format!("{}: {}", text(reason), text(message)),
                    (Some(reason), None) => text(reason),
                    (None, Some(message)) => text(message),
                    (None, None) => String::new(),
                };
            table.row([
                text(&worker["region"]),
                text(&worker["url"]),
                text(&worker["status"]),
                leases.join(", "),
                reason,
            ]);
        }
        table.print();
    }
    println!();
    println!(
        "{}",
        match (healthy, worker_json.is_empty()) {
            (true, true) => "registry ok; no worker checked (name them with --worker REGION=URL)",
            (true, false) => "all issuing",
            (false, _) => "NOT all issuing: see above",
        }
    );
    Ok(healthy)
}

fn parse_workers(given: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    given
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((region, url)) if !region.is_empty() && url.starts_with("http") => {
                Ok((region.to_owned(), url.to_owned()))
            }
            _ => Err(crate::Usage(format!("--worker {pair:?}: give REGION=URL, e.g. us-east-1=http://127.0.0.1:8701"))
                .into()),
        })
        .collect()
}
