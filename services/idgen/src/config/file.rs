//! What a service's configuration file may hold, read from its config structs themselves: their
//! serde attributes and doc comments, through schemars, are the one source. From them come
//! `--print-config` (a commented TOML of every key, its default, its unit and what it does) and
//! the line an unknown or mistyped key is named by, at `--check-config` and at start-up alike.
//!
//! The check reads the file alone, before the environment is laid over it, and is exactly as
//! lenient as the configuration reader behind it (which takes `"5000"` for a number and `1` for a
//! boolean): it names what the reader would refuse, by its line, and every such line at once.

use std::path::Path;

use schemars::JsonSchema;
use serde_json::{Map, Value};
use toml::de::{DeTable, DeValue};

/// The keys of one service's file: the top-level keys of one or more config structs.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    properties: Map<String, Value>,
    defs: Map<String, Value>,
}

/// A line of the file the reader would refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    /// 1-based.
    pub line: usize,
    pub message: String,
}

impl Keys {
    /// The keys of `T`, read from the top of the file.
    pub fn of<T: JsonSchema>() -> Self {
        Keys::default().and::<T>()
    }

    /// These keys and `T`'s, both read from the top of the file (the worker's listener keys beside
    /// the generator's).
    pub fn and<T: JsonSchema>(mut self) -> Self {
        let schema = schemars::schema_for!(T).to_value();
        if let Some(defs) = schema.get("$defs").and_then(Value::as_object) {
            self.defs.extend(defs.clone());
        }
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            self.properties.extend(properties.clone());
        }
        self
    }

    /// Every key, with its description, a leaf's default and unit, as a TOML file that reads back
    /// as the defaults. Keys without a default, and the entries of open tables, are commented out.
    pub fn print(&self, title: &str) -> String {
        let mut out = String::new();
        for line in title.lines() {
            out.push_str(&format!("# {line}\n").replace("# \n", "#\n"));
        }
        out.push_str(
            "# Every key with its default (a key without one is commented out). A file needs only the\n\
             # keys it changes. Generated from the configuration's own source: `--print-config`.\n\n",
        );
        self.print_table(&mut out, &[], &self.root());
        out
    }

    /// The keys (as `section.key`) whose source has no doc comment: each service's tests hold
    /// this empty, so `--print-config` says what every key does.
    pub fn undocumented(&self) -> Vec<String> {
        let mut missing = Vec::new();
        self.undocumented_in(&self.root(), "", &mut missing);
        missing
    }

    fn undocumented_in(&self, schema: &Value, prefix: &str, missing: &mut Vec<String>) {
        let values = self.open_table(schema);
        let properties = self.section(schema).or_else(|| values.and_then(|values| self.section(values)));
        for (key, property) in properties.into_iter().flatten() {
            let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            if self.about(property).is_empty() {
                missing.push(path.clone());
            }
            self.undocumented_in(property, &path, missing);
        }
    }

    /// The refusals of a configuration file's text, by line; none when the reader would take
    /// every key. A text that is not TOML is the reader's to refuse, with its own line.
    pub fn check(&self, text: &str) -> Vec<KeyError> {
        let Ok(table) = DeTable::parse(text) else { return Vec::new() };
        let mut errors = Vec::new();
        let lines = LineIndex::new(text);
        self.check_table(table.get_ref(), &self.root(), &mut Vec::new(), &lines, &mut errors);
        errors.sort_by_key(|error| error.line);
        errors
    }

    /// [`Keys::check`] of a file, as one error naming every refused line (and the command that
    /// prints every key, if there is one).
    pub fn check_file(&self, path: &Path, print_command: Option<&str>) -> anyhow::Result<()> {
        let Ok(text) = std::fs::read_to_string(path) else { return Ok(()) };
        let errors = self.check(&text);
        if errors.is_empty() {
            return Ok(());
        }
        let lines: Vec<String> =
            errors.iter().map(|error| format!("{}:{}: {}", path.display(), error.line, error.message)).collect();
        match print_command {
            Some(command) => anyhow::bail!("{}\n(`{command}` prints every key with its default)", lines.join("\n")),
            None => anyhow::bail!("{}", lines.join("\n")),
        }
    }

    /// The file's top level as a section: its keys are fixed, like any struct's.
    fn root(&self) -> Value {
        Value::Object(Map::from_iter([("properties".to_owned(), Value::Object(self.properties.clone()))]))
    }

    fn resolve<'a>(&'a self, mut schema: &'a Value) -> &'a Value {
        while let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            let name = reference.rsplit('/').next().unwrap_or_default();
            match self.defs.get(name) {
                Some(def) => schema = def,
                None => break,
            }
        }
        schema
    }

    /// What a key is for: its own doc comment, or else its type's (a section's struct).
    fn about(&self, property: &Value) -> String {
        let own = description(property);
        if own.is_empty() { description(self.resolve(property)) } else { own }
    }

    /// The alternatives of a schema that are not `null` (an `Option`'s `Some`), resolved.
    fn alternatives<'a>(&'a self, schema: &'a Value) -> Vec<&'a Value> {
        let schema = self.resolve(schema);
        match choices(schema) {
            Some(list) if !list.iter().all(|alternative| alternative.get("const").is_some()) => list
                .iter()
                .map(|alternative| self.resolve(alternative))
                .filter(|alternative| alternative.get("type") != Some(&Value::from("null")))
                .flat_map(|alternative| self.alternatives(alternative))
                .collect(),
            _ => vec![schema],
        }
    }

    /// Whether a key may be left out with nothing in its place (an `Option`).
    fn optional(&self, schema: &Value) -> bool {
        let schema = self.resolve(schema);
        types_of(schema).contains(&"null")
            || choices(schema)
                .into_iter()
                .flatten()
                .any(|alternative| types_of(self.resolve(alternative)).contains(&"null"))
    }

    /// A table's properties, when the schema is one (a struct: its keys are fixed).
    fn section<'a>(&'a self, schema: &'a Value) -> Option<&'a Map<String, Value>> {
        self.alternatives(schema).into_iter().find_map(|s| s.get("properties").and_then(Value::as_object))
    }

    /// Whether a key's value is a table: a section or a map.
    fn is_table(&self, schema: &Value) -> bool {
        self.section(schema).is_some() || self.open_table(schema).is_some()
    }

    /// A table of any keys (a map): the schema of its values.
    fn open_table<'a>(&'a self, schema: &'a Value) -> Option<&'a Value> {
        self.alternatives(schema)
            .into_iter()
            .find(|s| s.get("properties").is_none() && types_of(s).contains(&"object"))
            .and_then(|s| s.get("additionalProperties"))
            .filter(|values| values.is_object())
    }

    fn print_table(&self, out: &mut String, path: &[&str], schema: &Value) {
        let Some(properties) = self.section(schema) else { return };
        let mut sections = Vec::new();
        for (key, property) in properties {
            if self.is_table(property) {
                sections.push((key, property));
                continue;
            }
            comment(out, &description(property));
            let kind = self.kind(key, property);
            match property.get("default").filter(|value| !value.is_null()).and_then(toml_value) {
                Some(value) => out.push_str(&format!("{key} = {value}  # {kind}\n")),
                None => out.push_str(&format!("# {key} = …  # {kind}; not set by default\n")),
            }
        }
        for (key, property) in sections {
            let mut inner: Vec<&str> = path.to_vec();
            inner.push(key);
            out.push('\n');
            comment(out, &self.about(property));
            match self.open_table(property) {
                Some(values) => self.print_open_table(out, &inner, values, property.get("default")),
                // A section that is absent unless written: shown commented out.
                None if self.optional(property) => {
                    let mut section = format!("[{}]  # not set by default\n", inner.join("."));
                    self.print_table(&mut section, &inner, property);
                    commented(out, &section);
                }
                None => {
                    out.push_str(&format!("[{}]\n", inner.join(".")));
                    self.print_table(out, &inner, property);
                }
            }
        }
    }

    /// A map's entries as a commented example: `# [path.<name>]` and the value's keys, or
    /// `# <name> = …` for a map of plain values.
    fn print_open_table(&self, out: &mut String, path: &[&str], values: &Value, default: Option<&Value>) {
        match self.section(values) {
            Some(_) => {
                let mut example = format!("[{}.<name>]  # one table per entry, named as you choose\n", path.join("."));
                self.print_table(&mut example, path, values);
                commented(out, &example);
            }
            None => {
                out.push_str(&format!("[{}]\n", path.join(".")));
                let entries = default.and_then(Value::as_object).filter(|entries| !entries.is_empty());
                match entries {
                    Some(entries) => {
                        for (name, value) in entries {
                            let value = toml_value(value).unwrap_or_default();
                            out.push_str(&format!("{} = {value}  # {}\n", toml_key(name), self.kind("", values)));
                        }
                    }
                    None => {
                        out.push_str(&format!("# <name> = …  # {}; no entries by default\n", self.kind("", values)))
                    }
                }
            }
        }
    }

    /// What a leaf takes, with its unit.
    fn kind(&self, key: &str, schema: &Value) -> String {
        let alternatives = self.alternatives(schema);
        let schema = alternatives.first().copied().unwrap_or(schema);
        if let Some(values) = constants(schema) {
            return format!("one of {}", values.join(", "));
        }
        let unit = |plain: &str| match key {
            k if k.ends_with("_ms") => "milliseconds".to_owned(),
            k if k.ends_with("_bytes") => "bytes".to_owned(),
            k if k.ends_with("_seconds") || k.ends_with("_secs") => "seconds".to_owned(),
            _ => plain.to_owned(),
        };
        let types = types_of(schema);
        if types.contains(&"boolean") {
            "true or false".to_owned()
        } else if types.contains(&"integer") {
            let integer = unit("a whole number");
            if integer == "a whole number" { integer } else { format!("{integer}, a whole number") }
        } else if types.contains(&"number") {
            unit("a number")
        } else if types.contains(&"array") {
            let items = schema.get("items").map_or_else(|| "values".to_owned(), |items| self.kind("", items));
            format!("a list of: {items}")
        } else if types.contains(&"string") {
            "a string".to_owned()
        } else {
            "a value".to_owned()
        }
    }

    fn check_table(
        &self,
        table: &DeTable<'_>,
        schema: &Value,
        path: &mut Vec<String>,
        lines: &LineIndex,
        errors: &mut Vec<KeyError>,
    ) {
        let properties = self.section(schema);
        let open = self.open_table(schema);
        for (key, value) in table {
            let name: &str = key.get_ref();
            path.push(name.to_owned());
            let line = lines.line_of(key.span().start);
            match (properties.and_then(|p| p.get(name)), open) {
                (Some(property), _) => self.check_value(value.get_ref(), line, property, path, lines, errors),
                (None, Some(values)) => self.check_value(value.get_ref(), line, values, path, lines, errors),
                (None, None) => {
                    let known: Vec<&str> = properties.into_iter().flat_map(|p| p.keys()).map(String::as_str).collect();
                    let within = match path.len() {
                        1 => "at the top".to_owned(),
                        n => format!("in [{}]", path[..n - 1].join(".")),
                    };
                    let hint =
                        closest(name, &known).map_or_else(String::new, |near| format!("; did you mean `{near}`?"));
                    errors.push(KeyError {
                        line,
                        message: format!(
                            "unknown key `{}`{hint} (the keys {within}: {})",
                            path.join("."),
                            known.join(", ")
                        ),
                    });
                }
            }
            path.pop();
        }
    }

    fn check_value(
        &self,
        value: &DeValue<'_>,
        line: usize,
        schema: &Value,
        path: &mut Vec<String>,
        lines: &LineIndex,
        errors: &mut Vec<KeyError>,
    ) {
        if let DeValue::Table(table) = value
            && self.is_table(schema)
        {
            return self.check_table(table, schema, path, lines, errors);
        }
        let alternatives = self.alternatives(schema);
        if alternatives.iter().any(|alternative| self.takes(value, alternative)) {
            if let DeValue::Array(items) = value {
                let item_schema = alternatives.iter().find_map(|alternative| alternative.get("items"));
                if let Some(item_schema) = item_schema {
                    for item in items {
                        let line = lines.line_of(item.span().start);
                        self.check_value(item.get_ref(), line, item_schema, path, lines, errors);
                    }
                }
            }
            return;
        }
        let key = path.last().map_or("", String::as_str);
        errors.push(KeyError {
            line,
            message: format!("`{}` takes {}, not {}", path.join("."), self.kind(key, schema), what(value)),
        });
    }

    /// Whether the configuration reader takes `value` for a key of `schema` (it converts strings
    /// to numbers and booleans, and scalars to strings).
    fn takes(&self, value: &DeValue<'_>, schema: &Value) -> bool {
        if let Some(values) = constants(schema) {
            return matches!(value, DeValue::String(text) if values.iter().any(|v| v.as_str() == &**text));
        }
        let types = types_of(schema);
        let number = |n: Option<f64>| {
            n.is_some_and(|n| {
                let minimum = schema.get("minimum").and_then(Value::as_f64).unwrap_or(f64::MIN);
                let maximum = schema.get("maximum").and_then(Value::as_f64).unwrap_or(f64::MAX);
                (minimum..=maximum).contains(&n)
            })
        };
        types.iter().any(|kind| match *kind {
            "integer" | "number" => match value {
                DeValue::Integer(integer) => number(integer_value(integer)),
                DeValue::Float(float) => number(float.as_str().parse().ok()),
                DeValue::String(text) => number(text.trim().parse().ok()),
                _ => false,
            },
            "boolean" => match value {
                DeValue::Boolean(_) | DeValue::Integer(_) => true,
                DeValue::String(text) => {
                    ["true", "false", "1", "0", "yes", "no", "on", "off"].contains(&text.to_lowercase().as_str())
                }
                _ => false,
            },
            "string" => !matches!(value, DeValue::Array(_) | DeValue::Table(_)),
            "array" => matches!(value, DeValue::Array(_)) || matches!(value, DeValue::String(_)),
            "object" => matches!(value, DeValue::Table(_)),
            _ => true,
        })
    }
}

fn integer_value(integer: &toml::de::DeInteger<'_>) -> Option<f64> {
    i128::from_str_radix(integer.as_str(), integer.radix()).ok().map(|n| n as f64)
}

/// A schema's alternatives as schemars writes them: `anyOf` (an `Option`) or `oneOf` (an enum).
fn choices(schema: &Value) -> Option<&Vec<Value>> {
    schema.get("anyOf").or_else(|| schema.get("oneOf")).and_then(Value::as_array)
}

/// The `type` of a schema, as a list.
fn types_of(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(kind)) => vec![kind.as_str()],
        Some(Value::Array(kinds)) => kinds.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// The values of an enumeration of strings (`enum`, or `oneOf` of `const`s).
fn constants(schema: &Value) -> Option<Vec<String>> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return Some(values.iter().filter_map(Value::as_str).map(str::to_owned).collect());
    }
    let list = choices(schema)?;
    let values: Vec<String> =
        list.iter().filter_map(|alternative| alternative.get("const")?.as_str().map(str::to_owned)).collect();
    (values.len() == list.len() && !values.is_empty()).then_some(values)
}

/// A property's doc comment (schemars puts a lone first line in `title`).
fn description(schema: &Value) -> String {
    let title = schema.get("title").and_then(Value::as_str).unwrap_or_default();
    let description = schema.get("description").and_then(Value::as_str).unwrap_or_default();
    let text = match (title.is_empty(), description.is_empty()) {
        (false, false) => format!("{title}\n\n{description}"),
        (false, true) => title.to_owned(),
        _ => description.to_owned(),
    };
    // An intra-doc link reads as the code it names.
    text.replace("[`", "`").replace("`]", "`")
}

/// `text` as `# ` lines of at most 100 characters.
fn comment(out: &mut String, text: &str) {
    for paragraph in text.split("\n\n") {
        let mut line = String::from("#");
        for word in paragraph.split_whitespace() {
            if line.len() + 1 + word.len() > 100 && line.len() > 1 {
                out.push_str(&line);
                out.push('\n');
                line = String::from("#");
            }
            line.push(' ');
            line.push_str(word);
        }
        if line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
        }
    }
}

/// `text` with every line not already a comment commented out.
fn commented(out: &mut String, text: &str) {
    for line in text.lines() {
        if line.is_empty() {
            out.push('#');
        } else if line.starts_with('#') {
            out.push_str(line);
        } else {
            out.push_str("# ");
            out.push_str(line);
        }
        out.push('\n');
    }
}

/// A default as TOML text: scalars and lists of scalars (anything else is printed commented).
fn toml_value(value: &Value) -> Option<String> {
    match value {
        Value::Bool(_) | Value::Number(_) | Value::String(_) => Some(value.to_string()),
        Value::Array(items) => {
            let items: Option<Vec<String>> = items.iter().map(toml_value).collect();
            Some(format!("[{}]", items?.join(", ")))
        }
        _ => None,
    }
}

/// A key as TOML writes it: bare when it can be, quoted otherwise.
fn toml_key(key: &str) -> String {
    let bare = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare { key.to_owned() } else { Value::from(key).to_string() }
}

/// What a value of the file is, for a message.
fn what(value: &DeValue<'_>) -> String {
    match value {
        DeValue::String(text) => format!("the string {text:?}"),
        DeValue::Integer(integer) => format!("the number {integer}"),
        DeValue::Float(float) => format!("the number {}", float.as_str()),
        DeValue::Boolean(boolean) => format!("{boolean}"),
        DeValue::Datetime(_) => "a date and time".to_owned(),
        DeValue::Array(_) => "a list".to_owned(),
        DeValue::Table(_) => "a table".to_owned(),
    }
}

/// The known key nearest to `name`, if it is near enough to be a slip (an edit distance of at
/// most a third of its length).
fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|candidate| (strsim::levenshtein(name, candidate), *candidate))
        .filter(|(distance, _)| *distance <= name.chars().count().div_ceil(3))
        .min()
        .map(|(_, candidate)| candidate)
}

/// Byte offset to 1-based line.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> Self {
        let starts = std::iter::once(0).chain(text.match_indices('\n').map(|(at, _)| at + 1)).collect();
        LineIndex { starts }
    }

    fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|start| *start <= offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration of every shape the check meets: leaves, an optional section, a map of
    /// sections, a map of values, a list, an enumeration.
    #[derive(Debug, Default, serde::Deserialize, serde::Serialize, JsonSchema)]
    #[serde(deny_unknown_fields, default)]
    struct Example {
        /// How long to wait.
        wait_ms: u64,
        /// Whether to.
        enabled: bool,
        /// Where.
        name: Option<String>,
        /// The kind.
        kind: Kind,
        /// Some numbers.
        numbers: Vec<u32>,
        /// A section.
        inner: Inner,
        /// Sections by name.
        named: std::collections::BTreeMap<String, Inner>,
        /// Values by name.
        plain: std::collections::BTreeMap<String, String>,
        /// An optional section.
        maybe: Option<Inner>,
    }

    #[derive(Debug, Default, serde::Deserialize, serde::Serialize, JsonSchema)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        #[default]
        Sqlite,
        Dynamodb,
    }

    /// An inner section.
    #[derive(Debug, Default, serde::Deserialize, serde::Serialize, JsonSchema)]
    #[serde(deny_unknown_fields, default)]
    struct Inner {
        /// A small number.
        small: u8,
    }

    fn check(text: &str) -> Vec<(usize, String)> {
        Keys::of::<Example>().check(text).into_iter().map(|error| (error.line, error.message)).collect()
    }

    #[test]
    fn what_the_reader_takes_passes() {
        let text = "wait_ms = 5\nenabled = \"true\"\nname = 7\nkind = \"dynamodb\"\nnumbers = [1, 2]\n\
                    [inner]\nsmall = \"3\"\n[named.a]\nsmall = 1\n[plain]\nx = \"y\"\n[maybe]\nsmall = 255\n";
        assert_eq!(check(text), Vec::new());
        let read: Example =
            toml::from_str(text.replace("\"true\"", "true").replace("\"3\"", "3").replace("= 7", "= \"7\"").as_str())
                .unwrap();
        assert_eq!(read.inner.small, 3);
    }

    #[test]
    fn an_unknown_key_is_named_by_its_line_with_the_keys_it_could_be() {
        let errors = check("wait_ms = 5\n\n[inner]\nsmal = 3\n[named.b]\nbig = 1\n");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0].0, 4);
        assert!(errors[0].1.contains("unknown key `inner.smal`; did you mean `small`?"), "{}", errors[0].1);
        assert!(errors[0].1.contains("(the keys in [inner]: small)"), "{}", errors[0].1);
        assert_eq!(errors[1].0, 6);
        assert!(errors[1].1.contains("unknown key `named.b.big`"), "{}", errors[1].1);
        let top = check("wiat_ms = 1\n");
        assert!(top[0].1.contains("did you mean `wait_ms`?") && top[0].1.contains("the keys at the top"), "{top:?}");
        assert!(!check("zzzzzzz = 1\n")[0].1.contains("did you mean"), "nothing near");
    }

    #[test]
    fn a_mistyped_value_is_named_by_its_line_with_what_it_takes() {
        let errors =
            check("wait_ms = \"soon\"\nkind = \"dynamo\"\nnumbers = [1, \"x\"]\ninner = 5\n[maybe]\nsmall = 256\n");
        let lines: Vec<usize> = errors.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, [1, 2, 3, 4, 6], "{errors:?}");
        assert!(
            errors[0].1.contains("`wait_ms` takes milliseconds, a whole number, not the string \"soon\""),
            "{}",
            errors[0].1
        );
        assert!(errors[1].1.contains("one of sqlite, dynamodb"), "{}", errors[1].1);
        assert!(errors[2].1.contains("`numbers`"), "{}", errors[2].1);
        assert!(errors[3].1.contains("not the number 5"), "{}", errors[3].1);
        assert!(errors[4].1.contains("`maybe.small`"), "{}", errors[4].1);
        assert_eq!(check("wait_ms = -1\n").len(), 1, "below an unsigned key's minimum");
    }

    #[test]
    fn the_printed_file_reads_back_as_the_defaults_and_says_every_key() {
        let keys = Keys::of::<Example>();
        let printed = keys.print("example");
        assert_eq!(keys.check(&printed), Vec::new(), "{printed}");
        let read: Example = toml::from_str(&printed).unwrap();
        assert_eq!(format!("{read:?}"), format!("{:?}", Example::default()));
        for needle in [
            "# How long to wait.\nwait_ms = 0  # milliseconds, a whole number\n",
            "# name = …  # a string; not set by default\n",
            "kind = \"sqlite\"  # one of sqlite, dynamodb\n",
            "[inner]\n# A small number.\nsmall = 0",
            "# [named.<name>]",
            "[plain]\n# <name> = …",
        ] {
            assert!(printed.contains(needle), "{needle:?} not in:\n{printed}");
        }
        assert_eq!(keys.undocumented(), Vec::<String>::new());
    }
}
