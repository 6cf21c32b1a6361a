//! Who may create, resolve and look up public IDs: the `[access]` section, by caller identity
//! (the `Caller` the listener took from the client certificate), per operation and, in addition,
//! per format. A public ID is what keeps an internal ID from a customer, so the service answers
//! only the callers it was told about: without a section a production service answers nobody,
//! a development one (plain HTTP, every caller `anonymous`) everybody. A refusal is a 403 given
//! before any database or KMS work, counted by operation; the rules in force are replaced on
//! SIGHUP.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use idgen_server::{ANONYMOUS, Caller};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Deserialize;

use crate::format::Format;

/// In a list, any caller with a certificate identity (never the `anonymous` of plain HTTP).
pub const ANY_IDENTIFIED: &str = "*";

/// The three operations a caller may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `POST /v1/public-ids` and `POST /v1/public-ids:batch`: make (or find) a public ID.
    Create,
    /// `GET /v1/public-ids/{public_id}`: the internal ID behind a public ID.
    Resolve,
    /// `GET /v1/internal-ids/{internal_id}/public-id`: the public ID an internal ID has.
    Lookup,
}

impl Operation {
    pub const ALL: [Operation; 3] = [Operation::Create, Operation::Resolve, Operation::Lookup];

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Resolve => "resolve",
            Operation::Lookup => "lookup",
        }
    }
}

/// One list per operation, of caller identities (`"*"`: any identified caller).
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct OperationLists {
    /// Callers that may create public IDs in this format.
    pub create: Vec<String>,
    /// Callers that may resolve public IDs of this format.
    pub resolve: Vec<String>,
    /// Callers that may look up the public ID of an internal ID in this format.
    pub lookup: Vec<String>,
}

impl OperationLists {
    fn list(&self, operation: Operation) -> &[String] {
        match operation {
            Operation::Create => &self.create,
            Operation::Resolve => &self.resolve,
            Operation::Lookup => &self.lookup,
        }
    }
}

/// `[access]`: `create`, `resolve`, `lookup` name the callers allowed in every format;
/// `[access.opaque]`, `[access.uuidv7]`, `[access.encrypted]` add callers for that format only.
/// A caller is allowed an operation in a format when either list names it.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AccessSection {
    /// Callers that may create public IDs in every format.
    pub create: Vec<String>,
    /// Callers that may resolve public IDs of every format.
    pub resolve: Vec<String>,
    /// Callers that may look up public IDs in every format.
    pub lookup: Vec<String>,
    /// Callers allowed for the opaque format only.
    pub opaque: OperationLists,
    /// Callers allowed for the UUIDv7 format only.
    pub uuidv7: OperationLists,
    /// Callers allowed for the encrypted format only.
    pub encrypted: OperationLists,
}

impl AccessSection {
    fn every_format(&self) -> OperationLists {
        OperationLists { create: self.create.clone(), resolve: self.resolve.clone(), lookup: self.lookup.clone() }
    }

    fn of_format(&self, format: Format) -> &OperationLists {
        match format {
            Format::Opaque => &self.opaque,
            Format::Uuidv7 => &self.uuidv7,
            Format::Encrypted => &self.encrypted,
        }
    }

    /// Every list with its key, for validation and `--check-config`.
    fn lists(&self) -> Vec<(String, &[String])> {
        let mut lists: Vec<(String, &[String])> =
            vec![("create".into(), &self.create), ("resolve".into(), &self.resolve), ("lookup".into(), &self.lookup)];
        for format in [Format::Opaque, Format::Uuidv7, Format::Encrypted] {
            for operation in Operation::ALL {
                lists.push((
                    format!("{}.{}", format.as_str(), operation.as_str()),
                    self.of_format(format).list(operation),
                ));
            }
        }
        lists
    }

    /// Empty names are refused; so is `anonymous` outside development (it is the identity of
    /// plain-HTTP connections, which a production service does not take).
    pub fn validate(&self, development: bool) -> anyhow::Result<()> {
        for (key, list) in self.lists() {
            for name in list {
                if name.trim().is_empty() {
                    anyhow::bail!("access.{key}: an empty caller name");
                }
                if name == ANONYMOUS && !development {
                    anyhow::bail!(
                        "access.{key}: \"{ANONYMOUS}\" is the caller of plain-HTTP connections, which only \
                         development mode takes; name callers by their certificate identity"
                    );
                }
            }
        }
        Ok(())
    }
}

/// Who one list admits.
#[derive(Debug, Default)]
struct Admits {
    everybody: bool,
    any_identified: bool,
    callers: HashSet<String>,
}

impl Admits {
    fn of(list: &[String]) -> Admits {
        Admits {
            everybody: false,
            any_identified: list.iter().any(|name| name == ANY_IDENTIFIED),
            callers: list.iter().filter(|name| *name != ANY_IDENTIFIED).cloned().collect(),
        }
    }

    fn admits(&self, caller: &Caller) -> bool {
        self.everybody || (self.any_identified && caller.name() != ANONYMOUS) || self.callers.contains(caller.name())
    }

    fn nobody(&self) -> bool {
        !self.everybody && !self.any_identified && self.callers.is_empty()
    }
}

/// The rules in force: per operation, the every-format list and one list per format.
#[derive(Debug)]
pub struct Rules {
    by_operation: [(Admits, [(Format, Admits); 3]); 3],
}

const FORMATS: [Format; 3] = [Format::Opaque, Format::Uuidv7, Format::Encrypted];

impl Rules {
    /// What a service runs with: its section; without one, everybody in development and nobody
    /// in production.
    pub fn from_config(section: Option<&AccessSection>, development: bool) -> Rules {
        match section {
            Some(section) => Rules::of(section),
            None if development => Rules::everybody(),
            None => Rules::of(&AccessSection::default()),
        }
    }

    pub fn of(section: &AccessSection) -> Rules {
        let every = section.every_format();
        Rules {
            by_operation: Operation::ALL.map(|operation| {
                (
                    Admits::of(every.list(operation)),
                    FORMATS.map(|format| (format, Admits::of(section.of_format(format).list(operation)))),
                )
            }),
        }
    }

    /// Every caller, `anonymous` included, for everything: development without a section.
    pub fn everybody() -> Rules {
        let open = || Admits { everybody: true, ..Admits::default() };
        Rules { by_operation: Operation::ALL.map(|_| (open(), FORMATS.map(|format| (format, open())))) }
    }

    fn of_operation(&self, operation: Operation) -> &(Admits, [(Format, Admits); 3]) {
        &self.by_operation[Operation::ALL.iter().position(|o| *o == operation).expect("every operation")]
    }

    /// May `caller` do `operation` in `format`; with no format, in at least one.
    pub fn allows(&self, caller: &Caller, operation: Operation, format: Option<Format>) -> bool {
        let (every, by_format) = self.of_operation(operation);
        every.admits(caller)
            || by_format.iter().any(|(f, admits)| format.is_none_or(|format| format == *f) && admits.admits(caller))
    }

    /// The operations nobody may call in any format (said at start-up and by `--check-config`).
    pub fn closed(&self) -> Vec<Operation> {
        Operation::ALL
            .into_iter()
            .filter(|&operation| {
                let (every, by_format) = self.of_operation(operation);
                every.nobody() && by_format.iter().all(|(_, admits)| admits.nobody())
            })
            .collect()
    }
}

/// One line on the rules, for `--check-config` and the start-up log.
pub fn describe(section: Option<&AccessSection>, development: bool) -> String {
    let Some(section) = section else {
        return match development {
            true => "every caller may create, resolve and look up (development, no [access] section)".into(),
            false => "NOBODY may create, resolve or look up public IDs: no [access] section lists a caller".into(),
        };
    };
    let rules = Rules::of(section);
    let closed = rules.closed();
    let lists: Vec<String> = section
        .lists()
        .into_iter()
        .filter(|(_, list)| !list.is_empty())
        .map(|(key, list)| format!("{key}: {}", list.join(", ")))
        .collect();
    let mut line = if lists.is_empty() { "no caller is listed".to_owned() } else { lists.join("; ") };
    // Callers listed to create in a format without lookup in it: their creates are refused.
    let mut create_only = Vec::new();
    for format in FORMATS {
        for name in section.create.iter().chain(&section.of_format(format).create) {
            let entry = format!("{name} ({})", format.as_str());
            if name != ANY_IDENTIFIED
                && !rules.allows(&Caller::named(name), Operation::Lookup, Some(format))
                && !create_only.contains(&entry)
            {
                create_only.push(entry);
            }
        }
    }
    if !create_only.is_empty() {
        line += &format!(
            " (REFUSED to create, listed without lookup: {}; a create answers with an existing mapping, which is a lookup)",
            create_only.join(", ")
        );
    }
    if !closed.is_empty() {
        let names: Vec<&str> = closed.iter().map(|o| o.as_str()).collect();
        line += &format!(" (NOBODY may {}: no list names a caller)", names.join(", "));
    }
    line
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

/// Requests refused 403, by operation; every series exists (at 0) from the start.
#[derive(Debug, Default)]
pub struct AccessMetrics {
    forbidden: Family<OperationLabel, Counter>,
}

impl AccessMetrics {
    pub fn register(&self, registry: &mut Registry) {
        for operation in Operation::ALL {
            let _ = self.forbidden.get_or_create(&OperationLabel { operation: operation.as_str() });
        }
        registry.register(
            "idgen_public_requests_forbidden",
            "Requests refused 403 because the caller is not listed in [access] for the operation (and format)",
            self.forbidden.clone(),
        );
    }
}

/// The rules in force (replaced on reload) and the refusals counted.
pub struct Access {
    rules: ArcSwap<Rules>,
    metrics: Arc<AccessMetrics>,
    /// When a refusal was last logged, per operation (at most one line a second each).
    last_logged_s: [AtomicU64; 3],
}

/// A refusal: the operation (and the format, when the request named one) the caller may not do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forbidden {
    pub message: String,
}

impl Access {
    pub fn new(rules: Rules, metrics: Arc<AccessMetrics>) -> Access {
        Access { rules: ArcSwap::from_pointee(rules), metrics, last_logged_s: Default::default() }
    }

    /// Everybody, counted nowhere: tests and tools that build a state by hand.
    pub fn everybody() -> Access {
        Access::new(Rules::everybody(), Arc::default())
    }

    pub fn reload(&self, rules: Rules) {
        self.rules.store(Arc::new(rules));
    }

    /// Admits `caller` to `operation` (in `format`, when known), or refuses and counts it.
    /// A create answers with the mapping an internal ID already has (idempotent: one public ID
    /// per format), which is a lookup: so `caller` may create in `format` only if it may also look
    /// up in it. A caller listed for create alone would otherwise learn any internal ID's public
    /// ID and type, and whether it has one. Refused (403, counted under create) otherwise, before
    /// anything is read or made. The encrypted format is held to it too: it is computed, never
    /// stored, but deterministically, so its create answers any internal ID's encrypted public ID
    /// exactly as a lookup would.
    pub fn check_create_answer(&self, caller: &Caller, format: Format) -> Result<(), Forbidden> {
        if self.rules.load().allows(caller, Operation::Lookup, Some(format)) {
            return Ok(());
        }
        self.metrics.forbidden.get_or_create(&OperationLabel { operation: Operation::Create.as_str() }).inc();
        Err(Forbidden {
            message: format!(
                "the caller {:?} may create {} public IDs but not look them up: a create answers with the public ID an \
                 internal ID already has, which is a lookup, so [access] must list it under lookup too",
                caller.name(),
                format.as_str()
            ),
        })
    }

    pub fn check(&self, caller: &Caller, operation: Operation, format: Option<Format>) -> Result<(), Forbidden> {
        if self.rules.load().allows(caller, operation, format) {
            return Ok(());
        }
        self.metrics.forbidden.get_or_create(&OperationLabel { operation: operation.as_str() }).inc();
        let what = match (operation, format) {
            (Operation::Create, None) => "create public IDs".to_owned(),
            (Operation::Resolve, None) => "resolve public IDs".to_owned(),
            (Operation::Lookup, None) => "look up public IDs".to_owned(),
            (Operation::Create, Some(f)) => format!("create {} public IDs", f.as_str()),
            (Operation::Resolve, Some(f)) => format!("resolve {} public IDs", f.as_str()),
            (Operation::Lookup, Some(f)) => format!("look up {} public IDs", f.as_str()),
        };
        let slot = &self.last_logged_s[Operation::ALL.iter().position(|o| *o == operation).expect("every operation")];
        let now_s = idgen::system_unix_ms().max(0) as u64 / 1000;
        if slot.swap(now_s, Ordering::Relaxed) != now_s {
            tracing::warn!(caller = caller.name(), operation = operation.as_str(), "refused: {what} is not allowed");
        }
        Err(Forbidden { message: format!("the caller {:?} may not {what}", caller.name()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `[access]` section of a TOML text, read as the service reads its file.
    fn section(text: &str) -> AccessSection {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            access: AccessSection,
        }
        let file: File = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .unwrap()
            .try_deserialize()
            .unwrap();
        file.access
    }

    #[test]
    fn every_format_lists_and_per_format_lists_add_up() {
        let rules = Rules::of(&section(
            "[access]\ncreate = [\"spiffe://t/storefront\"]\nresolve = [\"*\"]\n\
             [access.encrypted]\nlookup = [\"spiffe://t/billing\"]\ncreate = [\"spiffe://t/billing\"]\n",
        ));
        let (storefront, billing, other) = (
            Caller::named("spiffe://t/storefront"),
            Caller::named("spiffe://t/billing"),
            Caller::named("spiffe://t/x"),
        );
        for format in FORMATS {
            assert!(rules.allows(&storefront, Operation::Create, Some(format)));
            assert!(!rules.allows(&storefront, Operation::Lookup, Some(format)));
            assert!(rules.allows(&other, Operation::Resolve, Some(format)), "* admits any identified caller");
            assert!(!rules.allows(&Caller::anonymous(), Operation::Resolve, Some(format)), "but not anonymous");
        }
        assert!(rules.allows(&billing, Operation::Create, Some(Format::Encrypted)));
        assert!(!rules.allows(&billing, Operation::Create, Some(Format::Opaque)));
        assert!(rules.allows(&billing, Operation::Lookup, None), "some format");
        assert!(!rules.allows(&other, Operation::Lookup, None));
        assert_eq!(rules.closed(), vec![]);
    }

    #[test]
    fn production_without_a_section_admits_nobody_development_everybody() {
        let closed = Rules::from_config(None, false);
        assert_eq!(closed.closed(), Operation::ALL.to_vec());
        assert!(!closed.allows(&Caller::named("spiffe://t/a"), Operation::Create, None));
        assert!(describe(None, false).contains("NOBODY may create, resolve or look up"));
        let open = Rules::from_config(None, true);
        assert!(open.allows(&Caller::anonymous(), Operation::Lookup, Some(Format::Encrypted)));
        assert!(open.closed().is_empty());
        let partial = section("[access]\ncreate = [\"spiffe://t/a\"]\n");
        assert!(describe(Some(&partial), false).ends_with("(NOBODY may resolve, lookup: no list names a caller)"));
    }

    #[test]
    fn anonymous_and_empty_names_are_refused_where_they_mean_nothing() {
        let anonymous = section("[access]\ncreate = [\"anonymous\"]\n");
        assert!(anonymous.validate(true).is_ok());
        let said = anonymous.validate(false).unwrap_err().to_string();
        assert!(said.contains("access.create") && said.contains("plain-HTTP"), "{said}");
        let empty = section("[access.uuidv7]\nresolve = [\" \"]\n");
        assert!(empty.validate(true).unwrap_err().to_string().contains("access.uuidv7.resolve"));
    }

    #[test]
    fn refusals_are_counted_by_operation_and_name_it() {
        let metrics = Arc::new(AccessMetrics::default());
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let access = Access::new(Rules::of(&section("[access]\nresolve = [\"a\"]\n")), metrics);
        let refused = access.check(&Caller::named("b"), Operation::Lookup, Some(Format::Uuidv7)).unwrap_err();
        assert_eq!(refused.message, "the caller \"b\" may not look up uuidv7 public IDs");
        assert!(access.check(&Caller::named("a"), Operation::Resolve, None).is_ok());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for (operation, count) in [("create", 0), ("resolve", 0), ("lookup", 1)] {
            let series = format!("idgen_public_requests_forbidden_total{{operation=\"{operation}\"}} {count}\n");
            assert!(text.contains(&series), "{series} missing from\n{text}");
        }
        access.reload(Rules::everybody());
        assert!(access.check(&Caller::named("b"), Operation::Lookup, None).is_ok(), "reloaded");
    }
}
