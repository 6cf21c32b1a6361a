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
    runbook_url, the URL being https://github.com/idgen/idgen/blob/main/runbooks/<page>.md; a page
    not written yet under runbooks/ is a NOTE line, not a failure;
  - infra/prometheus/alerts_test.yml has, for every alert, a case where it fires and one where it
    must not (an empty exp_alerts).
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
                declared = field_type(text, f.group(1)) if f else None
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

    for name in sorted(seen_metrics):
        used_by = ", ".join(sorted(seen_metrics[name]))
        matchers = [m for ms in seen_metrics[name].values() for m in ms]
        if name in EXTERNAL:
            report("NOTE", f"metric {name} ({used_by}): not idgen's, {EXTERNAL[name]}")
            continue
        hit = resolve(name, exported)
        if name in PENDING and not hit:
            if name in idgen_src:
                report("ok", f"metric {name} ({used_by}): appears in services/idgen/src (registration not parsed)")
            else:
                report("WARN", f"metric {name} ({used_by}): not in services/idgen/src yet (being added); its branch reads nothing until it is")
            continue
        if name in PENDING and not hit[1]["file"].startswith("services/idgen/src/"):
            report("WARN", f"metric {name} ({used_by}): registered in {hit[1]['file']}, not services/idgen/src")
            continue
        if not hit:
            report("FAIL", f"metric {name} ({used_by}): no Rust code registers it (under that name for its type)")
            continue
        base, entry, kind = hit
        labels = entry["labels"]
        label_names = set(labels or {})
        allowed = TARGET_LABELS | label_names | ({"le"} if name.endswith("_bucket") else set())
        bad = False
        for label, op, value in matchers:
            if label == "__name__":
                continue
            if labels is not None and label not in allowed:
                report("FAIL", f"metric {name} ({used_by}): label {label!r} is neither one of its labels ({', '.join(sorted(label_names)) or 'none'}) nor a target label")
                bad = True
            elif op == "=" and labels and labels.get(label, "").startswith("&'static str") and value not in literals:
                report("FAIL", f"metric {name} ({used_by}): {label}={value!r} is no value the code writes")
                bad = True
        if not bad and entry["type"] is None:
            report("NOTE", f"metric {name} ({used_by}): registered as {base} ({entry['file']}), but its type and labels could not be read from the code")
        elif not bad:
            shown = f"{kind} {base}, labels {', '.join(sorted(label_names)) or 'none'}"
            report("ok", f"metric {name} ({used_by}): {shown} ({entry['file']})")

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
            report("NOTE", f"runbook runbooks/{page}.md ({', '.join(alerts)}): not written yet")

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

    print(f"check_alerts: {failures} failed" if failures else "check_alerts: all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
