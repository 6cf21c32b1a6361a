#!/usr/bin/env python3
"""What promtool cannot check in infra/prometheus/alerts.yml: that the alerts agree with the Rust
code and with the runbooks.

Run by scripts/prometheus-check. One line per check; exits 1 if any check fails.

  --root DIR   check the tree at DIR instead of this repository (used to prove a check can fail:
               copy the tree, break one thing, run against the copy).

Checks:
  - every metric an alert expression reads is one the Rust code registers
    (`registry.register("<name>", …)` in services/*/src and registry/src), under the name
    Prometheus sees for its type: a counter as <name>_total, a histogram as <name>_bucket, _sum
    or _count, an info as <name>_info, a gauge as <name>. The type comes from the registered
    value (`Info::new`, or the field's declared type: Counter, Gauge, Histogram, in a Family or
    not). Not from the code: `up` (Prometheus) and `probe_success` (the blackbox exporter).
    idgen_clock_offset_seconds and idgen_clock_estimated_error_seconds count as exported only
    once they appear in services/idgen/src; until then each is a WARN line, not a failure;
  - every label matcher in a selector names a label the metric has (the fields of its Family's
    label struct), a target label (job, instance, region) or `le` on a histogram bucket; and an
    `=` matcher on a `&'static str` label field has a value the code writes (a string literal in
    the non-test sources);
  - every alert has severity page or ticket and the annotations summary, description and
    runbook_url, the URL being https://github.com/idgen/idgen/blob/main/runbooks/<page>.md, a page
    that exists under runbooks/;
  - infra/prometheus/alerts_test.yml has, for every alert, a case where it fires and one where it
    must not (an empty exp_alerts);
  - the Grafana dashboard infra/grafana/idgen.json: uid idgen-golden-signals, a title, an integer
    schemaVersion, the template variables datasource (a Prometheus data source) and region
    (label_values(<metric>, region)); every panel with a unique integer id, a type, a title, an
    integer gridPos x, y, w, h within the 24 columns, the ${datasource} data source and at least
    one target, each with a non-empty expr and a legendFormat and no undefined variable; and every
    metric of those expressions (and of the region variable's query) exported, with its label
    matchers, by the same rules as the alerts' ($region and Grafana's $__ variables allowed).
"""

import argparse
import re
import sys
from pathlib import Path

import yaml

RUNBOOK_URL = re.compile(r"^https://github\.com/idgen/idgen/blob/main/runbooks/([a-z0-9-]+)\.md$")
# Metrics an alert may read that the Rust code does not export, and whose they are.
EXTERNAL = {
    "up": "Prometheus's own, per scrape target",
    "probe_success": "the blackbox exporter's (a probe of the registry's /healthz)",
}
# Being added to the worker and the embedded generator; exported once they appear in services/idgen/src.
PENDING = ("idgen_clock_offset_seconds", "idgen_clock_estimated_error_seconds")
# Labels every target carries (the scrape configuration adds region).
TARGET_LABELS = {"job", "instance", "region"}
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "info": ("_info",),
}

AGGREGATORS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan", "atan2"} | AGGREGATORS
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}

TOKEN = re.compile(
    r"""\s+
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<duration>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)
    |(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|0x[0-9a-fA-F]+)
    |(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){}\[\],:@])
    """,
    re.VERBOSE,
)


def tokens(expr):
    pos = 0
    out = []
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read the expression at {expr[pos:pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind:
            out.append((kind, m.group(kind)))
    return out


def selectors(expr):
    """(metric name, [(label, op, value)]) for every metric selector of a PromQL expression."""
    toks = tokens(expr)
    found = []
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else (None, None)
        if kind == "ident" and text in LABEL_LIST_KEYWORDS and nxt == ("op", "("):
            i = toks.index(("op", ")"), i) + 1  # a label list: by (a, b)
            continue
        if kind == "ident" and text not in KEYWORDS and nxt != ("op", "("):
            matchers = []
            i += 1
            if i < len(toks) and toks[i] == ("op", "{"):
                i += 1
                while toks[i] != ("op", "}"):
                    if toks[i] == ("op", ","):
                        i += 1
                        continue
                    label, op, value = toks[i][1], toks[i + 1][1], toks[i + 2][1]
                    matchers.append((label, op, value[1:-1]))
                    i += 3
                i += 1
            found.append((text, matchers))
            continue
        if kind == "op" and text == "{":
            raise ValueError("a selector without a metric name")
        i += 1
    return found


def rust_sources(root):
    """Non-test Rust sources of the services and the registry."""
    files = sorted((root / "services").glob("*/src/**/*.rs")) + sorted((root / "registry").glob("src/**/*.rs"))
    return [f for f in files if "/tests/" not in f.as_posix()]


def strip_tests(text):
    """The file without its `#[cfg(test)]` module (by convention the last item of a file)."""
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


REGISTER = re.compile(r'\.register\(\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"\s*,\s*"(?:[^"\\]|\\.)*"\s*,\s*(.+?)\)\s*;', re.S)


def field_type(text, field):
    """The declared type of a struct field `field` holding a metric (a file may have several
    fields of that name; the one whose type is a metric wins)."""
    pattern = rf"^\s*(?:pub(?:\([a-z]+\))?\s+)?{re.escape(field)}\s*:\s*([A-Za-z][^;\n]*?)\s*,?\s*(?://.*)?$"
    declared = [m.group(1) for m in re.finditer(pattern, text, re.M)]
    metric = [d for d in declared if re.match(r"(?:Family|Counter|Gauge|Histogram)\b", d)]
    return (metric or declared or [None])[0]


def local_type(text, var):
    """The type a local variable holding a metric is built with: `let var = Gauge::…` or
    `let (var, …) = (Gauge::…, …)` (no Family: its labels are none)."""
    m = re.search(rf"let\s+(?:mut\s+)?{re.escape(var)}\s*(?::\s*[^=]+)?=\s*([A-Z][A-Za-z]*)\b", text)
    if m:
        return m.group(1)
    for m in re.finditer(r"let\s*\(([^)]*)\)\s*=\s*\((.*?)\)\s*;", text, re.S):
        names = [n.strip() for n in m.group(1).split(",")]
        values = re.findall(r"\b([A-Z][A-Za-z]*)(?:::<[^>]*>)?::(?:default|new)\(", m.group(2))
        if var in names and len(values) == len(names):
            return values[names.index(var)]
    return None


def label_fields(text, struct):
    m = re.search(rf"struct\s+{re.escape(struct)}\s*\{{(.*?)\}}", text, re.S)
    if not m:
        return None
    fields = {}
    for line in m.group(1).splitlines():
        f = re.match(r"\s*(?:pub(?:\([a-z]+\))?\s+)?([a-z_][a-z0-9_]*)\s*:\s*(.+?),?\s*$", line)
        if f:
            fields[f.group(1)] = f.group(2)
    return fields


def exported_metrics(root):
    """name -> {type, file, labels: {label: rust type} | None} for every registered metric."""
    metrics = {}
    for path in rust_sources(root):
        text = strip_tests(path.read_text())
        for m in REGISTER.finditer(text):
            name, value = m.group(1), m.group(2).strip().rstrip(",").strip()
            entry = {"file": path.relative_to(root).as_posix(), "type": None, "labels": None}
            if value.startswith("Info::new"):
                entry["type"] = "info"
                entry["labels"] = {k: "&'static str" for k in re.findall(r'\(\s*"([a-z_]+)"\s*,', value)}
            else:
                f = re.search(r"\.([a-z_][a-z0-9_]*)\.clone\(\)\s*$", value)
                local = re.fullmatch(r"([a-z_][a-z0-9_]*)\.clone\(\)", value)
                declared = field_type(text, f.group(1)) if f else local_type(text, local.group(1)) if local else None
                if declared:
                    entry["labels"] = {}
                    for kind in ("Histogram", "Counter", "Gauge"):
                        if re.search(rf"\b{kind}\b", declared):
                            entry["type"] = kind.lower()
                            break
                    family = re.match(r"Family<\s*([A-Za-z_][A-Za-z0-9_]*)\s*,", declared)
                    if family:
                        entry["labels"] = label_fields(text, family.group(1))
            metrics[name] = entry
    return metrics


def string_literals(root):
    found = set()
    for path in rust_sources(root):
        found.update(re.findall(r'"([a-zA-Z0-9_./:{}-]*)"', strip_tests(path.read_text())))
    return found


def resolve(name, exported):
    """(registered name, entry) that Prometheus shows as `name`, or None."""
    for base, entry in exported.items():
        kinds = [entry["type"]] if entry["type"] else list(SUFFIXES)
        for kind in kinds:
            for suffix in SUFFIXES[kind]:
                if base + suffix == name:
                    return base, entry, kind
    return None


DASHBOARD = "infra/grafana/idgen.json"
DASHBOARD_UID = "idgen-golden-signals"
# Grafana's own variables ($__rate_interval, ${__interval}), read as a duration.
GRAFANA_INTERVAL = re.compile(r"\$\{?__[a-z_]+\}?")
VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def check_dashboard(root, report, check_metric):
    """The Grafana dashboard infra/grafana/idgen.json: its structure, and that every expression
    reads metrics (and labels) the code exports, by the same rules as the alerts."""
    import json

    path = root / DASHBOARD
    try:
        dash = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        report("FAIL", f"dashboard {DASHBOARD}: cannot be read: {e}")
        return
    problems = []
    if dash.get("uid") != DASHBOARD_UID:
        problems.append(f"uid {dash.get('uid')!r}, not {DASHBOARD_UID!r}")
    if not isinstance(dash.get("title"), str) or not dash["title"].strip():
        problems.append("no title")
    version = dash.get("schemaVersion")
    if not isinstance(version, int) or isinstance(version, bool):
        problems.append(f"schemaVersion {version!r} is not an integer")
    variables = {v.get("name"): v for v in (dash.get("templating") or {}).get("list") or [] if isinstance(v, dict)}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("templating.list has no variable datasource of type datasource, query prometheus")
    region = variables.get("region")
    region_query = ""
    if region:
        q = region.get("query")
        region_query = q.get("query", "") if isinstance(q, dict) else q or ""
    if not region or not re.fullmatch(r"label_values\(\s*[a-zA-Z_:][a-zA-Z0-9_:]*\s*,\s*region\s*\)", region_query):
        problems.append("templating.list has no variable region with query label_values(<metric>, region)")
    for p in problems:
        report("FAIL", f"dashboard {DASHBOARD}: {p}")
    if not problems:
        report("ok", f"dashboard {DASHBOARD}: uid {dash['uid']}, schemaVersion {version}, variables {', '.join(sorted(variables))}")

    # Every panel, those inside collapsed rows too.
    panels = []
    for panel in dash.get("panels") or []:
        panels.append(panel)
        if isinstance(panel, dict) and panel.get("type") == "row":
            panels.extend(panel.get("panels") or [])
    if not panels:
        report("FAIL", f"dashboard {DASHBOARD}: no panels")
    seen_metrics = {}
    if region_query:
        name = re.search(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", region_query)
        if name:
            seen_metrics.setdefault(name.group(1), {}).setdefault("variable region", [])
    ids = {}
    for n, panel in enumerate(panels):
        if not isinstance(panel, dict):
            report("FAIL", f"dashboard panel #{n + 1}: not an object")
            continue
        title = panel.get("title")
        shown = f"dashboard panel {panel.get('id')!r} {title!r}"
        bad = []
        if not isinstance(panel.get("id"), int) or isinstance(panel.get("id"), bool):
            bad.append("no integer id")
        elif panel["id"] in ids:
            bad.append(f"id {panel['id']} also that of {ids[panel['id']]!r}")
        else:
            ids[panel["id"]] = title
        if not isinstance(title, str) or not title.strip():
            bad.append("no title")
        if not panel.get("type"):
            bad.append("no type")
        grid = panel.get("gridPos")
        if not isinstance(grid, dict) or any(not isinstance(grid.get(k), int) for k in ("x", "y", "w", "h")):
            bad.append("gridPos without integer x, y, w and h")
        elif grid["x"] < 0 or grid["y"] < 0 or grid["w"] < 1 or grid["h"] < 1 or grid["x"] + grid["w"] > 24:
            bad.append(f"gridPos {grid} outside the 24-column grid")
        if panel.get("type") == "row":
            for b in bad:
                report("FAIL", f"{shown}: {b}")
            continue
        datasource = panel.get("datasource")
        uid = datasource.get("uid") if isinstance(datasource, dict) else datasource
        if uid not in ("${datasource}", "$datasource"):
            bad.append(f"datasource {datasource!r} is not the variable ${{datasource}}")
        targets = [t for t in panel.get("targets") or [] if isinstance(t, dict)]
        exprs = [t.get("expr") for t in targets]
        if not targets:
            bad.append("no targets")
        for t, expr in zip(targets, exprs):
            if not isinstance(expr, str) or not expr.strip():
                bad.append(f"target {t.get('refId')!r} has no expr")
                continue
            if "legendFormat" not in t:
                bad.append(f"target {t.get('refId')!r} has no legendFormat")
            unknown = sorted({v for v in VARIABLE.findall(expr) if not v.startswith("__")} - set(variables))
            if unknown:
                bad.append(f"target {t.get('refId')!r} uses undefined variables {', '.join(unknown)}")
            try:
                found = selectors(GRAFANA_INTERVAL.sub("5m", expr))
            except (ValueError, IndexError) as e:
                bad.append(f"target {t.get('refId')!r}: {e}")
                continue
            for name, matchers in found:
                seen_metrics.setdefault(name, {}).setdefault(f"panel {panel.get('id')}", []).extend(matchers)
        for b in bad:
            report("FAIL", f"{shown}: {b}")
        if not bad:
            report("ok", f"{shown}: {panel['type']}, {len(targets)} target{'s' if len(targets) > 1 else ''}")

    for name in sorted(seen_metrics):
        used_by = ", ".join(sorted(seen_metrics[name], key=lambda u: (not u.startswith("variable"), int(u.split()[-1]) if u.split()[-1].isdigit() else 0)))
        matchers = [m for ms in seen_metrics[name].values() for m in ms]
        check_metric(name, used_by, matchers, what="dashboard metric")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    root = args.root.resolve()
    failures = 0

    def report(status, message):
        nonlocal failures
        if status == "FAIL":
            failures += 1
        print(f"{status:<4} {message}")

    rules_path = root / "infra/prometheus/alerts.yml"
    rules = [r for g in yaml.safe_load(rules_path.read_text())["groups"] for r in g["rules"] if "alert" in r]
    exported = exported_metrics(root)
    literals = string_literals(root)
    idgen_src = "\n".join(strip_tests(p.read_text()) for p in sorted((root / "services/idgen/src").glob("**/*.rs")))

    seen_metrics = {}
    for rule in rules:
        for name, matchers in selectors(rule["expr"]):
            seen_metrics.setdefault(name, {}).setdefault(rule["alert"], []).extend(matchers)

    def check_metric(name, used_by, matchers, what="metric"):
        """One report line for a metric read by `used_by` with `matchers`."""
        if name in EXTERNAL:
            report("NOTE", f"{what} {name} ({used_by}): not idgen's, {EXTERNAL[name]}")
            return
        hit = resolve(name, exported)
        if name in PENDING and not hit:
            if name in idgen_src:
                report("ok", f"{what} {name} ({used_by}): appears in services/idgen/src (registration not parsed)")
            else:
                report("WARN", f"{what} {name} ({used_by}): not in services/idgen/src yet (being added); its branch reads nothing until it is")
            return
        if name in PENDING and not hit[1]["file"].startswith("services/idgen/src/"):
            report("WARN", f"{what} {name} ({used_by}): registered in {hit[1]['file']}, not services/idgen/src")
            return
        if not hit:
            report("FAIL", f"{what} {name} ({used_by}): no Rust code registers it (under that name for its type)")
            return
        base, entry, kind = hit
        labels = entry["labels"]
        label_names = set(labels or {})
        allowed = TARGET_LABELS | label_names | ({"le"} if name.endswith("_bucket") else set())
        bad = False
        for label, op, value in matchers:
            if label == "__name__":
                continue
            if labels is not None and label not in allowed:
                report("FAIL", f"{what} {name} ({used_by}): label {label!r} is neither one of its labels ({', '.join(sorted(label_names)) or 'none'}) nor a target label")
                bad = True
            elif op == "=" and labels and labels.get(label, "").startswith("&'static str") and value not in literals:
                report("FAIL", f"{what} {name} ({used_by}): {label}={value!r} is no value the code writes")
                bad = True
        if not bad and entry["type"] is None:
            report("NOTE", f"{what} {name} ({used_by}): registered as {base} ({entry['file']}), but its type and labels could not be read from the code")
        elif not bad:
            shown = f"{kind} {base}, labels {', '.join(sorted(label_names)) or 'none'}"
            report("ok", f"{what} {name} ({used_by}): {shown} ({entry['file']})")

    for name in sorted(seen_metrics):
        used_by = ", ".join(sorted(seen_metrics[name]))
        matchers = [m for ms in seen_metrics[name].values() for m in ms]
        check_metric(name, used_by, matchers)

    pages = {}
    for rule in rules:
        name = rule["alert"]
        severity = rule.get("labels", {}).get("severity")
        if severity not in ("page", "ticket"):
            report("FAIL", f"alert {name}: severity {severity!r}, not page or ticket")
        annotations = rule.get("annotations", {})
        missing = [a for a in ("summary", "description", "runbook_url") if not annotations.get(a)]
        if missing:
            report("FAIL", f"alert {name}: no {', '.join(missing)}")
        url = annotations.get("runbook_url", "")
        m = RUNBOOK_URL.match(url)
        if not m:
            report("FAIL", f"alert {name}: runbook_url {url!r} is not https://github.com/idgen/idgen/blob/main/runbooks/<page>.md")
            continue
        pages.setdefault(m.group(1), []).append(name)
        if not missing and severity in ("page", "ticket"):
            report("ok", f"alert {name}: severity {severity}, runbook runbooks/{m.group(1)}.md")
    for page, alerts in sorted(pages.items()):
        if not (root / "runbooks" / f"{page}.md").is_file():
            report("FAIL", f"runbook runbooks/{page}.md ({', '.join(alerts)}): no such page")

    tests_path = root / "infra/prometheus/alerts_test.yml"
    fires, quiet = set(), set()
    for test in yaml.safe_load(tests_path.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    for rule in rules:
        name = rule["alert"]
        lacking = [what for what, have in (("fires", fires), ("must not fire", quiet)) if name not in have]
        if lacking:
            report("FAIL", f"alert {name}: alerts_test.yml has no case where it {' or '.join(lacking)}")
        else:
            report("ok", f"alert {name}: tested firing and not firing")
    unknown = (fires | quiet) - {r["alert"] for r in rules}
    for name in sorted(unknown):
        report("FAIL", f"alerts_test.yml tests {name}, which alerts.yml does not define")

    check_dashboard(root, report, check_metric)

    print(f"check_alerts: {failures} failed" if failures else "check_alerts: all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
