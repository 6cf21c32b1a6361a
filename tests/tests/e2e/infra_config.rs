//! The production configuration examples in `infra/config/` are accepted by the real binary:
//! `idgen worker|registry|public serve --check-config` (and each service's own binary, which says
//! the same) validates each in production mode and
//! loads its TLS files, and says what the service would run with. The certificate paths are
//! pointed at a development CA's files (the only change made to the examples); a copy with a
//! required key left out, or a key misspelt, is refused with the key named.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use idgen_e2e::{idgen_bin, workspace_bin};
use idgen_server::pki::DevCa;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The example `name` with `/etc/idgen/tls/` replaced by `tls`, written into `dir`.
fn example(dir: &Path, tls: &Path, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("infra/config").join(name)).unwrap();
    let text = edit(text.replace("/etc/idgen/tls/", &format!("{}/", tls.display())));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `idgen <args> --config <file> --check-config` with no IDGEN_ variables of the test's own;
/// the service's own binary (`binary`) says the same.
fn check(args: &[&str], binary: &str, file: &Path) -> Output {
    let output = check_with(Command::new(idgen_bin()).args(args), file);
    let own = check_with(&mut Command::new(workspace_bin(binary)), file);
    // The one difference: who says it.
    let said = text(&own).replace(&format!("{binary}: "), "idgen: ");
    assert_eq!((&own.status, said), (&output.status, text(&output)), "{binary} --check-config");
    output
}

fn check_with(command: &mut Command, file: &Path) -> Output {
    command.arg("--config").arg(file).arg("--check-config");
    for (key, _) in std::env::vars() {
        if key.starts_with("IDGEN_WORKER_")
            || key.starts_with("IDGEN_REGISTRY_")
            || key.starts_with("IDGEN_PUBLIC_IDS_")
        {
            command.env_remove(key);
        }
    }
    command.output().unwrap()
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// Every file name the examples refer to under /etc/idgen/tls/, issued by one development CA
/// but the operators' CA (which must be another) and the two CAs' revocation lists.
fn certificates(dir: &Path) {
    let ca = DevCa::new("idgen infra-config test CA").unwrap();
    for bundle in ["ca.pem", "clients-ca.pem", "rds-ca.pem"] {
        std::fs::write(dir.join(bundle), ca.ca_pem()).unwrap();
    }
    ca.server(&["localhost"]).unwrap().write(dir, "server").unwrap();
    ca.client("spiffe://idgen.internal/fleet/eu-west-1").unwrap().write(dir, "worker").unwrap();
    std::fs::write(dir.join("clients-crl.pem"), ca.crl(&[]).unwrap()).unwrap();
    let operators = DevCa::new("idgen infra-config operator CA").unwrap();
    std::fs::write(dir.join("operators-ca.pem"), operators.ca_pem()).unwrap();
    std::fs::write(dir.join("operators-crl.pem"), operators.crl(&[]).unwrap()).unwrap();
}

#[test]
fn every_production_example_passes_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    certificates(&tls);

    let worker = example(dir.path(), &tls, "worker.toml", |t| t);
    let out = check(&["worker"], "idgen-worker", &worker);
    let said = text(&out);
    assert!(out.status.success(), "worker.toml refused:\n{said}");
    for expected in [
        "worker configuration OK",
        "mode: production",
        "region: eu-west-1",
        "DynamoDB in eu-west-1",
        "mutual TLS (callers named by uri_san, 1 CRL file(s)) on 0.0.0.0:8080",
        "must be synchronized",
        "health listener: plain HTTP on 0.0.0.0:8081, GET /healthz only",
        "limits: at most 4096 connections per listener (1024 TLS handshakes under way, 32 from one address), 16384 bytes of headers a request; deadlines: TLS handshake 5000 ms, headers 5000 ms, body 10000 ms, idle 75000 ms",
    ] {
        assert!(said.contains(expected), "worker check does not say {expected:?}:\n{said}");
    }

    let registry = example(dir.path(), &tls, "registry.toml", |t| t);
    let out = check(&["registry"], "idgen-registry", &registry);
    let said = text(&out);
    assert!(out.status.success(), "registry.toml refused:\n{said}");
    for expected in [
        "registry configuration OK",
        "database: PostgreSQL at postgres://",
        "home region: us-east-1",
        "mutual TLS (callers named by uri_san, operators by their own CA, 2 CRL file(s)) on 0.0.0.0:8700",
        "health listener: plain HTTP on 0.0.0.0:9700",
        "limits: at most 4096 connections per listener",
    ] {
        assert!(said.contains(expected), "registry check does not say {expected:?}:\n{said}");
    }

    let public = example(dir.path(), &tls, "public-ids.toml", |t| t);
    let out = check(&["public", "serve"], "idgen-public-ids", &public);
    let said = text(&out);
    assert!(out.status.success(), "public-ids.toml refused:\n{said}");
    for expected in [
        "public-ID service configuration OK",
        "database: PostgreSQL",
        "KMS: key arn:aws:kms:",
        "mutual TLS (callers named by uri_san, 1 CRL file(s)) on 0.0.0.0:8709",
        "health listener: plain HTTP on 0.0.0.0:9709",
        "limits: at most 4096 connections per listener",
    ] {
        assert!(said.contains(expected), "public-ID check does not say {expected:?}:\n{said}");
    }

    // The types the stack's PublicIdsTypes documents as its example, in place of `types = {}`.
    let template = std::fs::read_to_string(repo().join("infra/cloudformation/global.yaml")).unwrap();
    let described = template
        .lines()
        .find(|line| line.contains("Description: 'Typed public IDs as a TOML inline table, e.g. "))
        .expect("PublicIdsTypes is described with an example");
    let types = described.split("e.g. ").nth(1).and_then(|rest| rest.split("; {}").next()).unwrap();
    assert!(types.starts_with('{') && types.ends_with('}'), "{types:?}");
    let typed = example(dir.path(), &tls, "public-ids.toml", |t| {
        assert!(t.contains("\ntypes = {}\n"), "public-ids.toml sets types = {{}}");
        t.replace("\ntypes = {}\n", &format!("\ntypes = {types}\n"))
    });
    let out = check(&["public", "serve"], "idgen-public-ids", &typed);
    let said = text(&out);
    assert!(out.status.success(), "public-ids.toml with the stack's example types refused:\n{said}");
    for expected in ["order_ (1, opaque)", "customer_ (2, uuidv7)"] {
        assert!(said.contains(expected), "public-ID check does not say {expected:?}:\n{said}");
    }
}

#[test]
fn check_config_refuses_what_a_start_would_refuse_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    certificates(&tls);

    // A production worker without its region: refused, the key named.
    let no_region = example(dir.path(), &tls, "worker.toml", |t| {
        t.lines().filter(|l| !l.starts_with("region = ")).collect::<Vec<_>>().join("\n")
    });
    let out = check(&["worker"], "idgen-worker", &no_region);
    assert!(!out.status.success(), "a worker without a region passed:\n{}", text(&out));
    assert!(text(&out).contains("region"), "the refusal does not name the region:\n{}", text(&out));

    // A connection cap of 0, a deadline switched off, a health port on the service port: refused, named.
    for (change, named) in [
        (("max_connections = 4096", "max_connections = 0"), "limits.max_connections"),
        (("idle_timeout_ms = 75000", "idle_timeout_ms = 0"), "limits.idle_timeout_ms"),
        (("health_listen = \"0.0.0.0:8081\"", "health_listen = \"0.0.0.0:8080\""), "health_listen"),
    ] {
        let broken = example(dir.path(), &tls, "worker.toml", |t| t.replace(change.0, change.1));
        let out = check(&["worker"], "idgen-worker", &broken);
        assert!(!out.status.success(), "{change:?} passed:\n{}", text(&out));
        assert!(text(&out).contains(named), "the refusal of {change:?} does not name {named}:\n{}", text(&out));
    }

    // A misspelt key in the registry: refused, the key named.
    let misspelt = example(dir.path(), &tls, "registry.toml", |t| t.replace("horizon_lead_ms", "horizon_lead"));
    let out = check(&["registry"], "idgen-registry", &misspelt);
    assert!(!out.status.success(), "a misspelt registry key passed:\n{}", text(&out));
    assert!(text(&out).contains("horizon_lead"), "the refusal does not name the key:\n{}", text(&out));

    // Production names callers by URI SAN only: `identity = "cn"` is refused (exit 2), the key named.
    let cn = example(dir.path(), &tls, "worker.toml", |t| t.replace("identity = \"uri_san\"", "identity = \"cn\""));
    let out = check(&["worker"], "idgen-worker", &cn);
    assert_eq!(out.status.code(), Some(2), "a production worker reading CNs:\n{}", text(&out));
    assert!(text(&out).contains("tls.identity = \"uri_san\""), "the refusal does not name the key:\n{}", text(&out));
    // Operators by a CA of their own, and only then: without it, or with the callers' CA, refused.
    let no_operator_ca = example(dir.path(), &tls, "registry.toml", |t| {
        t.lines().filter(|l| !l.starts_with("operator_ca = ")).collect::<Vec<_>>().join("\n")
    });
    let out = check(&["registry"], "idgen-registry", &no_operator_ca);
    assert!(!out.status.success(), "certificate operators without an operator CA passed:\n{}", text(&out));
    assert!(text(&out).contains("certificate_operators needs tls.operator_ca"), "{}", text(&out));
    let shared = example(dir.path(), &tls, "registry.toml", |t| t.replace("operators-ca.pem", "clients-ca.pem"));
    let out = check(&["registry"], "idgen-registry", &shared);
    assert!(!out.status.success(), "an operator CA shared with the callers passed:\n{}", text(&out));
    assert!(text(&out).contains("shares a CA with tls.client_ca"), "{}", text(&out));

    // The registry and the public-ID service without their database, or on SQLite: refused with
    // exit status 2, the key named, never a start on a local file.
    let services = [
        ("registry.toml", &["registry"][..], "idgen-registry"),
        ("public-ids.toml", &["public", "serve"][..], "idgen-public-ids"),
    ];
    for (name, args, binary) in services {
        let no_database = example(dir.path(), &tls, name, |t| {
            t.lines().filter(|l| !l.starts_with("database_url = ")).collect::<Vec<_>>().join("\n")
        });
        let out = check(args, binary, &no_database);
        assert_eq!(out.status.code(), Some(2), "{name} without a database:\n{}", text(&out));
        assert!(text(&out).contains("database_url (postgres://"), "{name}:\n{}", text(&out));
        let sqlite = example(dir.path(), &tls, name, |t| {
            t.lines()
                .map(|l| if l.starts_with("database_url = ") { "database_url = \"sqlite:///tmp/x.db\"" } else { l })
                .collect::<Vec<_>>()
                .join("\n")
        });
        let out = check(args, binary, &sqlite);
        assert_eq!(out.status.code(), Some(2), "{name} on SQLite:\n{}", text(&out));
        assert!(text(&out).contains("SQLite is for development only"), "{name}:\n{}", text(&out));
    }

    // A certificate that is not there: the TLS files are loaded, not only named.
    std::fs::remove_file(tls.join("server-key.pem")).unwrap();
    let public = example(dir.path(), &tls, "public-ids.toml", |t| t);
    let out = check(&["public", "serve"], "idgen-public-ids", &public);
    assert!(!out.status.success(), "a missing key file passed:\n{}", text(&out));
    assert!(text(&out).contains("server-key.pem"), "the refusal does not name the file:\n{}", text(&out));
}

/// `--print-config` of every service, through both binaries that run it: a commented TOML of
/// every key that the same service reads back (in development mode, which needs nothing else)
/// as its defaults, naming what each key does.
#[test]
fn print_config_prints_every_key_and_the_service_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = idgen_bin().parent().unwrap().to_path_buf();
    for (args, binary, development, keys) in [
        (
            &["worker"][..],
            "idgen-worker",
            "IDGEN_WORKER_DEVELOPMENT",
            &["listen", "[lease]", "fence_ms", "[clock]"][..],
        ),
        (&["registry"][..], "idgen-registry", "IDGEN_REGISTRY_DEVELOPMENT", &["horizon_lead_ms", "[limits]"][..]),
        (&["public", "serve"][..], "idgen-public-ids", "IDGEN_PUBLIC_IDS_DEVELOPMENT", &["[cache]", "max_entries"][..]),
    ] {
        let printed = Command::new(idgen_bin()).args(args).arg("--print-config").output().unwrap();
        assert!(printed.status.success(), "{args:?} --print-config:\n{}", text(&printed));
        let stdout = String::from_utf8(printed.stdout.clone()).unwrap();
        for key in keys {
            assert!(stdout.contains(key), "{args:?} --print-config does not print {key}:\n{stdout}");
        }
        let standalone = Command::new(bin_dir.join(binary)).arg("--print-config").output().unwrap();
        assert_eq!(String::from_utf8_lossy(&standalone.stdout), stdout, "{binary} prints another configuration");
        let file = dir.path().join(format!("{binary}.toml"));
        std::fs::write(&file, &stdout).unwrap();
        let mut command = Command::new(idgen_bin());
        command.args(args).arg("--config").arg(&file).arg("--check-config").env(development, "true");
        let out = command.output().unwrap();
        assert!(out.status.success(), "{args:?}: the printed configuration is refused:\n{}", text(&out));
    }
}

/// An unknown or mistyped key is named by its line of the file, with what the key takes or the
/// key it was likely meant to be; every such line at once.
#[test]
fn check_config_names_the_line_of_an_unknown_or_mistyped_key() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    certificates(&tls);
    let line_of = |path: &Path, needle: &str| {
        let text = std::fs::read_to_string(path).unwrap();
        1 + text.lines().position(|line| line.starts_with(needle)).expect("the edited line")
    };
    let broken = example(dir.path(), &tls, "worker.toml", |t| {
        t.replace("fence_ms = ", "fence_msx = ").replace("max_connections = 4096", "max_connections = \"many\"")
    });
    let out = check(&["worker"], "idgen-worker", &broken);
    assert!(!out.status.success(), "a misspelt and a mistyped key passed:\n{}", text(&out));
    let said = text(&out);
    let fence = format!(
        "{}:{}: unknown key `lease.fence_msx`; did you mean `fence_ms`?",
        broken.display(),
        line_of(&broken, "fence_msx")
    );
    let cap = format!(
        "{}:{}: `limits.max_connections` takes a whole number",
        broken.display(),
        line_of(&broken, "max_connections")
    );
    assert!(said.contains(&fence) && said.contains(&cap), "expected {fence:?} and {cap:?} in:\n{said}");
    assert!(said.contains("idgen worker --print-config"), "{said}");

    let misspelt = example(dir.path(), &tls, "public-ids.toml", |t| t.replace("max_entries", "max_entry"));
    let out = check(&["public", "serve"], "idgen-public-ids", &misspelt);
    let expected = format!("{}:{}: unknown key `cache.max_entry`", misspelt.display(), line_of(&misspelt, "max_entry"));
    assert!(!out.status.success() && text(&out).contains(&expected), "expected {expected:?} in:\n{}", text(&out));
}
