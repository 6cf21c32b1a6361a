#!/usr/bin/env python3
"""What cfn-lint and checkov cannot check in infra/cloudformation: that the templates agree with
the Rust code and with the files in the repository they deploy.

Run by scripts/infra-check with its virtualenv's python (cfn-lint's own template decoder reads
the templates, short tags and all). One line per check; exits 1 if any check fails.

  --root DIR   check the tree at DIR instead of this repository (used to prove each check can
               fail: copy the tree, break one thing, run against the copy).

Facts taken from the code at check time, so that a change on either side without the other
fails here:
  - the DynamoDB calls of every Rust file using aws_sdk_dynamodb (`self.client.<op>()`), each
    with the table it is made on (`.table_name(&self.table)` lease, `&self.audit` audit,
    anything else both), and the calls `quarantine`, `release_quarantine`,
    `verify_lease_table` and `verify_audit_table` reach through their helpers;
  - the lease tables per layout (services/idgen/src/config/mod.rs, `lease.tables` default) and the
    audit table name (`format!("{table}-audit")` in dynamodb.rs);
  - the key schema `create_tables` creates and `verify_lease_table` / `verify_audit_table` expect;
  - the lease timing defaults (services/idgen/src/lease/keeper.rs) and the worker's shutdown grace
    (services/idgen-worker/src/config.rs).
"""

import argparse
import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11
    sys.exit("scripts/check_infra.py needs Python 3.11 or later (tomllib)")

from cfnlint.decode import decode

# --------------------------------------------------------------------------------------------
# What the checks compare against that is not in the code.
# --------------------------------------------------------------------------------------------

# Every DynamoDB operation, in the SDK's snake case: `self.client.<name>()` with a name outside
# this list (and outside NOT_OPERATIONS) is an error, so a new call cannot slip past the check.
DYNAMODB_OPERATIONS = """
batch_execute_statement batch_get_item batch_write_item create_backup create_global_table
create_table delete_backup delete_item delete_resource_policy delete_table describe_backup
describe_continuous_backups describe_contributor_insights describe_endpoints describe_export
describe_global_table describe_global_table_settings describe_import
describe_kinesis_streaming_destination describe_limits describe_table
describe_table_replica_auto_scaling describe_time_to_live disable_kinesis_streaming_destination
enable_kinesis_streaming_destination execute_statement execute_transaction
export_table_to_point_in_time get_item get_resource_policy import_table list_backups
list_contributor_insights list_exports list_global_tables list_imports list_tables
list_tags_of_resource put_item put_resource_policy query restore_table_from_backup
restore_table_to_point_in_time scan tag_resource transact_get_items transact_write_items
untag_resource update_continuous_backups update_contributor_insights update_global_table
update_global_table_settings update_item update_kinesis_streaming_destination update_table
update_table_replica_auto_scaling update_time_to_live
""".split()
NOT_OPERATIONS = {"config"}  # `self.client.config()`: the client's own settings, no request

# What a generator's role may do: item calls and DescribeTable. Anything else the code calls
# (CreateTable in `create_tables`, run by `idgen leases init` in development) is table
# administration, which no generator role or embedder policy may hold.
GENERATOR_ACTIONS = {
    "GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "BatchGetItem",
    "BatchWriteItem", "TransactGetItems", "TransactWriteItems", "ConditionCheckItem",
    "DescribeTable", "PartiQLSelect", "PartiQLInsert", "PartiQLUpdate", "PartiQLDelete",
}

# AWS-managed policies a role in these templates may carry; none grants anything on DynamoDB.
# (AmazonSSMManagedInstanceCore is not one: it also reads every SSM parameter of the account. A
# host role carries the template's SessionManagerPolicy, held to SSM_AGENT_ACTIONS below.)
ALLOWED_AWS_MANAGED_POLICIES = {
    "service-role/AmazonRDSEnhancedMonitoringRole",
}

# The SSM agent's own calls (Session Manager, Run Command): the only actions of these services a
# host role may hold.
SSM_AGENT_ACTIONS = {
    "ssm:UpdateInstanceInformation", "ssm:ListInstanceAssociations",
    "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel",
    "ec2messages:AcknowledgeMessage", "ec2messages:DeleteMessage", "ec2messages:FailMessage",
    "ec2messages:GetEndpoint", "ec2messages:GetMessages", "ec2messages:SendReply",
}

AMI_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64"

# The values infra/config/*.toml show, for the parameters that have no default (or whose
# example differs) and for attributes known only once deployed. Everything else a template's
# configuration substitutes comes from its parameter defaults.
EXAMPLE_VALUES = {
    "regional.yaml": {
        "AWS::Region": "eu-west-1",
        "RegionName": "eu-west-1",
    },
    "global.yaml": {
        "AWS::Region": "us-east-1",
        "RegistryTlsSecretArn": "arn:aws:secretsmanager:us-east-1:111122223333:secret:idgen/registry-tls-AbCdEf",
        "RegistryDb.Endpoint.Address": "idgen-registry.c0example0.us-east-1.rds.amazonaws.com",
        "RegistryDb.Endpoint.Port": "5432",
        "PublicIdsDb.Endpoint.Address": "idgen-public-ids.c0example0.us-east-1.rds.amazonaws.com",
        "PublicIdsDb.Endpoint.Port": "5432",
        "PublicIdsDbReader.Endpoint.Address": "idgen-public-ids-reader.c0example0.us-east-1.rds.amazonaws.com",
        "PublicIdsDbReader.Endpoint.Port": "5432",
        "PublicIdsKey.Arn": "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    },
}
# global.yaml deployed in another region (Deployment=public-ids-reader), reading the example home
# stack above through its outputs: its public-ID hosts must write infra/config/public-ids.toml
# but for read_database_url, which names this region's replica.
READER_EXAMPLE = {
    "AWS::Region": "eu-west-1",
    "Deployment": "public-ids-reader",
    "PublicIdsDnsName": "public-ids.eu-west-1.idgen.internal",
    "PublicIdsPrimaryRegion": "us-east-1",
    "PublicIdsSourceDbArn": "arn:aws:rds:us-east-1:111122223333:db:idgen-public-ids",
    "PublicIdsPrimaryAddress": EXAMPLE_VALUES["global.yaml"]["PublicIdsDb.Endpoint.Address"],
    "PublicIdsPrimaryCidr": "10.10.0.0/16",
    "PublicIdsKeyArn": EXAMPLE_VALUES["global.yaml"]["PublicIdsKey.Arn"],
    "PublicIdsAppDbSecretArn": "arn:aws:secretsmanager:us-east-1:111122223333:secret:PublicIdsAppDbSecret-AbCdEf",
    "PublicIdsReaderRoleName": "idgen-global-PublicIdsReaderRole-AbCdEf012345",
    "PublicIdsDbReader.Endpoint.Address": "idgen-public-ids-reader.c0example0.eu-west-1.rds.amazonaws.com",
    "PublicIdsDbReader.Endpoint.Port": "5432",
}
# What a reader region's stack must not hold: the registry's half, and the home region's
# primary database, its key and its secrets.
HOME_ONLY = ["PublicIdsDb", "PublicIdsKey", "PublicIdsKeyAlias", "PublicIdsAppDbSecret", "RegistryAppDbSecret",
             "PublicIdsRole", "PublicIdsReaderRole"]
# The home stack once it admits reader regions (and so makes their role).
HOME_WITH_READERS = {**EXAMPLE_VALUES["global.yaml"], "PublicIdsReaderRegionsPrefixList": "pl-0123456789abcdef0"}

# Which file each host writes from which heredoc of its user data, and what it must equal.
VERBATIM = [  # (template, launch template, heredoc marker, repository file)
    ("regional.yaml", "WorkerLaunchTemplate", "IDGEN_EOF_CHRONY", "infra/chrony/chrony.conf"),
    ("regional.yaml", "WorkerLaunchTemplate", "IDGEN_EOF_UNIT", "infra/systemd/idgen-worker.service"),
]
CONFIGS = [  # (template, launch template, heredoc marker, repository file)
    ("regional.yaml", "WorkerLaunchTemplate", "IDGEN_EOF_CONFIG", "infra/config/worker.toml"),
    ("global.yaml", "RegistryLaunchTemplate", "IDGEN_EOF_CONFIG", "infra/config/registry.toml"),
    ("global.yaml", "PublicIdsLaunchTemplate", "IDGEN_EOF_CONFIG", "infra/config/public-ids.toml"),
]
SHARED_SCRIPTS = ["IDGEN_EOF_TLS_FETCH"]
# The unit each launch template writes, in its IDGEN_EOF_UNIT heredoc, beside its configuration.
UNITS = [  # (template, launch template)
    ("regional.yaml", "WorkerLaunchTemplate"),
    ("global.yaml", "RegistryLaunchTemplate"),
    ("global.yaml", "PublicIdsLaunchTemplate"),
]
# What a unit's LimitNOFILE must leave beyond the two listeners' connections (service port and
# health port, each up to [limits] max_connections): the database pool, the lease store, logs.
OTHER_FILES = 1024


class Failed(Exception):
    pass


RESULTS = []


def check(description):
    """Runs the decorated function as one check: it returns a detail string (or None) on
    success and raises Failed with the reason otherwise."""

    def run(function):
        try:
            detail = function()
        except Failed as failure:
            RESULTS.append(False)
            print(f"FAIL {description}: {failure}")
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            RESULTS.append(False)
            print(f"FAIL {description}: the template is not shaped as expected ({type(error).__name__}: {error})")
        else:
            RESULTS.append(True)
            print(f"ok   {description}" + (f" ({detail})" if detail else ""))
        return function

    return run


def require(condition, message):
    if not condition:
        raise Failed(message)


# --------------------------------------------------------------------------------------------
# Reading the Rust code.
# --------------------------------------------------------------------------------------------

def strip_rust(source):
    """The source with comments removed and string/char literal contents blanked (same
    length), so that braces and calls inside them are not mistaken for code."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", source[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and source[j] != '"':
                j += 2 if source[j] == "\\" else 1
            out.append('"' + " " * (j - i - 1) + '"')
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", source[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", source[i:i + 4])
            out.append("'" + " " * (len(m.group(0)) - 2) + "'")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def closing_brace(code, start):
    """The index of the brace that closes the one at `start` in stripped code."""
    depth, j = 0, start
    while j < len(code):
        depth += {"{": 1, "}": -1}.get(code[j], 0)
        if depth == 0:
            break
        j += 1
    return j


def functions(code):
    """name -> list of bodies (text between the braces) of every `fn name` in stripped code."""
    found = {}
    for match in re.finditer(r"\bfn\s+(\w+)", code):
        start = code.find("{", match.end())
        semicolon = code.find(";", match.end())
        if start < 0 or (0 <= semicolon < start):
            continue  # a declaration without a body
        found.setdefault(match.group(1), []).append(code[start + 1:closing_brace(code, start)])
    return found


def camel(snake):
    return "".join(part.capitalize() for part in snake.split("_"))


def dynamodb_calls(root):
    """(every (action, table kind) the code calls, the calls each function reaches, files read)."""
    files = sorted(
        path for directory in ("services", "registry") for path in (root / directory).rglob("*.rs")
        if "tests" not in path.relative_to(root).parts and "examples" not in path.relative_to(root).parts
        and ("aws_sdk_dynamodb" in path.read_text() or path.parent.name == "dynamodb")
    )
    require(files, "no Rust file uses aws_sdk_dynamodb")
    everything, reach = set(), {}
    # A module split into files (`lease/dynamodb/`) is read as one: its helpers call across them.
    units = {}
    for path in files:
        units.setdefault(path.parent if path.parent.name == "dynamodb" else path, []).append(path)
    for unit, paths in units.items():
        path = unit
        code = strip_rust("\n".join(p.read_text() for p in paths))
        bodies = functions(code)
        direct = {}
        for name, texts in bodies.items():
            for text in texts:
                calls = direct.setdefault(name, set())
                for call in re.finditer(r"self\s*\.\s*client\s*\.\s*([a-z_]+)\s*\(\s*\)", text):
                    op = call.group(1)
                    if op in NOT_OPERATIONS:
                        continue
                    require(op in DYNAMODB_OPERATIONS,
                            f"{path.relative_to(root)} calls self.client.{op}(), which check_infra.py does not know")
                    rest = text[call.end():]
                    end = rest.find(".send()")
                    chain = rest if end < 0 else rest[:end]
                    # The argument as written (strings are blanked, field names are not).
                    table = re.search(r"\.\s*table_name\s*\(\s*([^)]*)\)", chain)
                    argument = re.sub(r"\s", "", table.group(1)) if table else ""
                    kinds = {"&self.table": ["lease"], "&self.audit": ["audit"]}.get(argument, ["lease", "audit"])
                    for kind in kinds:
                        calls.add((camel(op), kind))
                        everything.add((camel(op), kind))
        helpers = {name: set(re.findall(r"self\s*\.\s*(\w+)\s*\(", " ".join(texts))) & bodies.keys()
                   for name, texts in bodies.items()}

        def reached(name, seen):
            if name in seen:
                return set()
            seen.add(name)
            calls = set(direct.get(name, ()))
            for helper in helpers.get(name, ()):
                calls |= reached(helper, seen)
            return calls

        for name in bodies:
            reach.setdefault(name, set()).update(reached(name, set()))
    return everything, reach, files


def rust_number(text):
    return int(text.replace("_", ""))


def code_facts(root):
    facts = {}
    # The DynamoDB lease store's files (`lease/dynamodb/`), read as one.
    raw = "\n".join(path.read_text() for path in sorted((root / "services/idgen/src/lease/dynamodb").glob("*.rs")))
    code = strip_rust(raw)
    facts["calls"], facts["reach"], facts["files"] = dynamodb_calls(root)

    suffix = re.search(r'format!\("\{table\}(-[a-z]+)"\)', raw)
    require(suffix, "dynamodb.rs: no `format!(\"{table}-…\")` naming the audit table")
    facts["audit_suffix"] = suffix.group(1)

    config_rs = (root / "services/idgen/src/config/mod.rs").read_text()
    tables = re.search(r"tables:\s*BTreeMap::from\(\[(.*?)\]\)", config_rs, re.S)
    require(tables, "config.rs: no `tables: BTreeMap::from([...])` default")
    facts["lease_tables"] = dict(re.findall(r'\("(\w+)"\.into\(\),\s*"([\w.-]+)"\.into\(\)\)', tables.group(1)))
    require(facts["lease_tables"], "config.rs: the default lease.tables is empty")

    def schemas(function, audit_function=None):
        """The key schemas `function` gives self.table and (in `audit_function`, if another
        function does that) self.audit."""
        keys = {}
        for which in ("table", "audit"):
            name = audit_function if which == "audit" and audit_function else function
            bodies = functions(code).get(name)
            require(bodies, f"dynamodb.rs: no fn {name}")
            body = raw_body(raw, name)
            # `&self.table, &[...]` in create_tables; `self.verify(&self.audit, &keys)` in
            # verify_audit_table.
            match = re.search(r"&self\." + which + r"\s*,\s*&(\[.*?\]|\w+)", body, re.S)
            require(match, f"dynamodb.rs {name}: no key schema for self.{which}")
            text = match.group(1)
            if not text.startswith("["):  # a local: `let audit_keys = [...]`
                local = re.search(r"let\s+" + text + r"\s*=\s*(\[.*?\]);", body, re.S)
                require(local, f"dynamodb.rs {name}: {text} is not a local array")
                text = local.group(1)
            keys["lease" if which == "table" else "audit"] = [
                (name, kind, {"Hash": "HASH", "Range": "RANGE"}[key])
                for name, kind, key in re.findall(r'\("(\w+)",\s*ScalarAttributeType::(\w+),\s*KeyType::(\w+)\)', text)
            ]
        return keys

    facts["schema"] = schemas("create_tables")
    facts["verified_schema"] = schemas("verify_lease_table", "verify_audit_table")

    keeper = (root / "services/idgen/src/lease/keeper.rs").read_text()
    default = re.search(r"impl Default for LeaseConfig\s*\{(.*?)\n\}", keeper, re.S)
    require(default, "keeper.rs: no `impl Default for LeaseConfig`")
    for key in ("lease_ms", "renew_interval_ms", "fence_ms"):
        value = re.search(key + r":\s*([\d_]+)", default.group(1))
        require(value, f"keeper.rs: LeaseConfig::default has no {key}")
        facts[key] = rust_number(value.group(1))

    worker = (root / "services/idgen-worker/src/config.rs").read_text()
    grace = re.search(r"impl Default for ListenerSection.*?shutdown_grace_ms:\s*([\d_]+)", worker, re.S)
    require(grace, "idgen-worker config.rs: no shutdown_grace_ms default")
    facts["shutdown_grace_ms"] = rust_number(grace.group(1))

    limits_rs = root / "services/idgen-server/src/limits.rs"
    require(limits_rs.exists(), "services/idgen-server/src/limits.rs is missing: no connection cap to size LimitNOFILE by")
    limits = limits_rs.read_text()
    cap = re.search(r"impl Default for LimitsSection.*?max_connections:\s*([\d_]+)", limits, re.S)
    require(cap, "idgen-server limits.rs: no max_connections default")
    facts["max_connections"] = rust_number(cap.group(1))
    return facts


def raw_body(raw, function):
    """The original text of `fn function`'s first body (strings intact), located through the
    stripped text so that braces in strings do not confuse it."""
    code = strip_rust(raw)
    match = re.search(r"\bfn\s+" + function + r"\b", code)
    start = code.find("{", match.end())
    return raw[start + 1:closing_brace(code, start)]


# --------------------------------------------------------------------------------------------
# Reading the templates.
# --------------------------------------------------------------------------------------------

def load(path):
    template, matches = decode(str(path))
    require(template is not None and not matches, f"{path} does not decode: {matches}")
    return template


def resources(template, kind):
    return {name: body for name, body in template.get("Resources", {}).items() if body.get("Type") == kind}


def default(template, parameter):
    spec = template["Parameters"][parameter]
    require("Default" in spec, f"parameter {parameter} has no default")
    return spec["Default"]


def number(template, value):
    """A literal number, or a Ref to a parameter, as its default."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return int(default(template, value["Ref"]))
    return int(value)


def ref(value):
    return value["Ref"] if isinstance(value, dict) and set(value) == {"Ref"} else None


def user_data_sub(template, launch_template):
    """A launch template's user data: Fn::Base64 of Fn::Sub, a string or [string, variables]."""
    data = template["Resources"][launch_template]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    sub = data.get("Fn::Sub") if isinstance(data, dict) else None
    if isinstance(sub, str):
        return sub, {}
    require(isinstance(sub, list) and len(sub) == 2 and isinstance(sub[0], str) and isinstance(sub[1], dict),
            f"{launch_template}: UserData is not Fn::Base64 of one Fn::Sub (a string, or a string and its variables)")
    return sub[0], sub[1]


def user_data(template, launch_template):
    return user_data_sub(template, launch_template)[0]


def value_of(template, example, node):
    """A template value as CloudFormation would render it for the example stack `example`
    (parameter and attribute values; everything else from the parameter defaults): literals,
    Ref, Fn::GetAtt, Fn::Sub, Fn::If. None for AWS::NoValue."""
    if isinstance(node, bool):
        return "true" if node else "false"
    if isinstance(node, (str, int, float)):
        return str(node)
    if not isinstance(node, dict) or len(node) != 1:
        return f"<unresolved {node!r}>"
    (function, argument), = node.items()
    if function == "Ref":
        if argument == "AWS::NoValue":
            return None
        if argument in example:
            return example[argument]
        parameter = template.get("Parameters", {}).get(argument)
        if parameter is not None and "Default" in parameter:
            return str(parameter["Default"])
        resource = template.get("Resources", {}).get(argument)
        if resource:
            named = {"AWS::DynamoDB::Table": "TableName", "AWS::Logs::LogGroup": "LogGroupName"}.get(resource["Type"])
            if named and named in resource["Properties"]:
                return value_of(template, example, resource["Properties"][named])
        return f"<unresolved {argument}>"
    if function == "Fn::GetAtt":
        key = argument if isinstance(argument, str) else ".".join(argument)
        return example.get(key, f"<unresolved {key}>")
    if function == "Fn::Sub":
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        return substitute(template, example, text, variables)
    if function == "Fn::If":
        chosen = argument[1] if holds(template, example, argument[0]) else argument[2]
        return value_of(template, example, chosen)
    return f"<unresolved {function}>"


def holds(template, example, condition):
    """Whether the template's condition (a name, or a condition expression) holds for `example`."""
    if isinstance(condition, str):
        return holds(template, example, template["Conditions"][condition])
    (function, argument), = condition.items()
    if function == "Condition":
        return holds(template, example, argument)
    if function == "Fn::Equals":
        sides = [value_of(template, example, side) for side in argument]
        unresolved = [side for side in sides if side is None or side.startswith("<unresolved")]
        require(not unresolved, f"a condition compares what check_infra.py cannot resolve: {unresolved}")
        return sides[0] == sides[1]
    if function == "Fn::Not":
        return not holds(template, example, argument[0])
    if function == "Fn::And":
        return all(holds(template, example, c) for c in argument)
    if function == "Fn::Or":
        return any(holds(template, example, c) for c in argument)
    raise Failed(f"a condition check_infra.py cannot evaluate: {condition!r}")


def present(template, example):
    """The resources the example stack creates (those whose Condition holds)."""
    return {name: body for name, body in template.get("Resources", {}).items()
            if "Condition" not in body or holds(template, example, body["Condition"])}


def substitute(template, example, text, variables=None):
    """Fn::Sub as CloudFormation would render it for the example stack `example`."""
    variables = variables or {}

    def value(match):
        key = match.group(1)
        if key.startswith("!"):
            return "${" + key[1:] + "}"
        if key in variables:
            rendered = value_of(template, example, variables[key])
        elif "." in key and not key.startswith("AWS::"):
            rendered = value_of(template, example, {"Fn::GetAtt": key})
        else:
            rendered = value_of(template, example, {"Ref": key})
        return "" if rendered is None else rendered

    return re.sub(r"\$\{([^}]*)\}", value, text)


def rendered_user_data(template, name, launch_template, example=None):
    """A launch template's user data as the example stack (infra/config/'s, or `example`) gets it."""
    text, variables = user_data_sub(template, launch_template)
    return substitute(template, EXAMPLE_VALUES.get(name, {}) if example is None else example, text, variables)


def heredoc(script, marker):
    """The text a `cat > FILE <<'MARKER'` … `MARKER` block writes (with its final newline)."""
    found = re.findall(r"<<'?" + marker + r"'?\n(.*?\n)" + marker + r"\n", script, re.S)
    require(len(found) == 1, f"{len(found)} heredocs {marker} in the user data (expected one)")
    return found[0]


def embedded_file(template, name, launch_template, marker, example=None):
    """The file a launch template's user data writes in its `MARKER` heredoc, rendered for the
    example stack (infra/config/'s, or `example`)."""
    return heredoc(rendered_user_data(template, name, launch_template, example), marker)


def table_kind(facts, table_name):
    audits = {t + facts["audit_suffix"] for t in facts["lease_tables"].values()}
    if table_name in audits:
        return "audit"
    if table_name in facts["lease_tables"].values():
        return "lease"
    return None


def dynamodb_grants(template, facts, statements, where):
    """{table resource: set of DynamoDB actions} granted by these statements; fails on anything
    but plain Allow statements naming table resources by Fn::GetAtt Arn."""
    tables = resources(template, "AWS::DynamoDB::Table")
    grants = {}
    for statement in statements:
        actions = statement.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        require("NotAction" not in statement and "NotResource" not in statement,
                f"{where}: NotAction/NotResource is not allowed")
        dynamo = [a for a in actions if isinstance(a, str) and a.lower().startswith("dynamodb:")]
        if not dynamo:
            continue
        require(statement.get("Effect") == "Allow", f"{where}: a DynamoDB statement that is not Allow")
        for action in dynamo:
            require("*" not in action, f"{where}: wildcard action {action}")
        targets = statement.get("Resource", [])
        targets = [targets] if not isinstance(targets, list) else targets
        require(targets, f"{where}: a DynamoDB statement without Resource")
        for target in targets:
            attribute = target.get("Fn::GetAtt") if isinstance(target, dict) else None
            require(attribute is not None and list(attribute)[1:] == ["Arn"] and attribute[0] in tables,
                    f"{where}: DynamoDB resource {target!r} is not a lease or audit table's Fn::GetAtt Arn")
            require(table_kind(facts, tables[attribute[0]]["Properties"]["TableName"]) is not None,
                    f"{where}: {attribute[0]} is not one of the lease or audit tables")
            grants.setdefault(attribute[0], set()).update(a.split(":", 1)[1] for a in dynamo)
    return grants


def role_statements(template, role_name):
    """Every statement a role carries: inline policies and the template's managed policies it
    attaches (AWS-managed ones must be in ALLOWED_AWS_MANAGED_POLICIES)."""
    role = template["Resources"][role_name]["Properties"]
    statements = []
    for policy in role.get("Policies", []):
        statements += policy["PolicyDocument"]["Statement"]
    for arn in role.get("ManagedPolicyArns", []):
        name = ref(arn)
        if name:
            statements += template["Resources"][name]["Properties"]["PolicyDocument"]["Statement"]
            continue
        text = arn.get("Fn::Sub") if isinstance(arn, dict) else arn
        managed = re.fullmatch(r"arn:\$\{AWS::Partition\}:iam::aws:policy/(.+)", str(text))
        require(managed and managed.group(1) in ALLOWED_AWS_MANAGED_POLICIES,
                f"{role_name}: managed policy {arn!r} is not one this check knows grants no DynamoDB access")
    return statements


def expected_actions(facts):
    """Per table kind, the generator actions the code calls (administration left out)."""
    return {kind: {a for a, k in facts["calls"] if k == kind and a in GENERATOR_ACTIONS} for kind in ("lease", "audit")}


def describe(actions):
    return "lease " + "/".join(sorted(actions["lease"])) + "; audit " + "/".join(sorted(actions["audit"]))


# --------------------------------------------------------------------------------------------
# The checks.
# --------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    root = parser.parse_args().root.resolve()
    directory = root / "infra/cloudformation"

    try:
        facts = code_facts(root)
    except Failed as failure:
        print(f"FAIL reading the Rust code: {failure}")
        return 1
    try:
        templates = {name: load(directory / name) for name in ("regional.yaml", "global.yaml")}
    except Failed as failure:
        print(f"FAIL loading the templates: {failure}")
        return 1
    regional, global_ = templates["regional.yaml"], templates["global.yaml"]
    expected = expected_actions(facts)
    admin = sorted({a for a, _ in facts["calls"] if a not in GENERATOR_ACTIONS})
    print(f"--   code: DynamoDB calls in {', '.join(str(f.relative_to(root)) for f in facts['files'])}: "
          f"{describe(expected)}" + (f"; administration, for no generator role: {', '.join(admin)}" if admin else ""))

    @check("the lease and audit tables are exactly the code's, one pair per layout")
    def _():
        tables = {body["Properties"]["TableName"]: name for name, body in resources(regional, "AWS::DynamoDB::Table").items()}
        wanted = set(facts["lease_tables"].values()) | {t + facts["audit_suffix"] for t in facts["lease_tables"].values()}
        require(set(tables) == wanted, f"template has {sorted(tables)}, the code uses {sorted(wanted)}")
        return ", ".join(f"{layout}: {t} + {t}{facts['audit_suffix']}" for layout, t in sorted(facts["lease_tables"].items()))

    @check("every table's key schema is what dynamodb.rs creates (and verify_lease_table / verify_audit_table expect)")
    def _():
        require(facts["schema"] == facts["verified_schema"],
                f"dynamodb.rs disagrees with itself: create_tables {facts['schema']}, verify_*_table {facts['verified_schema']}")
        for name, body in resources(regional, "AWS::DynamoDB::Table").items():
            props = body["Properties"]
            kind = table_kind(facts, props["TableName"])
            require(kind, f"{name}: {props['TableName']} is neither a lease table of the code nor its audit table")
            schema = facts["schema"][kind]
            keys = [(k["AttributeName"], k["KeyType"]) for k in props["KeySchema"]]
            require(keys == [(a, key) for a, _, key in schema], f"{name}: KeySchema {keys}, code {schema}")
            attributes = sorted((a["AttributeName"], a["AttributeType"]) for a in props["AttributeDefinitions"])
            require(attributes == sorted((a, t) for a, t, _ in schema), f"{name}: AttributeDefinitions {attributes}, code {schema}")
        return "; ".join(f"{kind}: " + ", ".join(f"{a} {t} {k}" for a, t, k in s) for kind, s in facts["schema"].items())

    @check("every table: point-in-time recovery, deletion protection, SSE, on-demand, retained")
    def _():
        count = 0
        for template in templates.values():
            for name, body in resources(template, "AWS::DynamoDB::Table").items():
                props = body["Properties"]
                require(props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled") is True,
                        f"{name}: point-in-time recovery is off")
                require(props.get("DeletionProtectionEnabled") is True, f"{name}: deletion protection is off")
                require(props.get("SSESpecification", {}).get("SSEEnabled") is True, f"{name}: SSE is off")
                require(props.get("BillingMode") == "PAY_PER_REQUEST", f"{name}: not on-demand")
                require(body.get("DeletionPolicy") == "Retain", f"{name}: DeletionPolicy is not Retain")
                count += 1
        return f"{count} tables"

    @check("the embedder policy grants exactly the code's item calls, on the lease/audit tables only")
    def _():
        policy = regional["Resources"]["LeaseTablesPolicy"]["Properties"]["PolicyDocument"]["Statement"]
        return exact_grants(regional, facts, expected, policy, "LeaseTablesPolicy")

    @check("the worker role grants exactly the code's item calls, on the lease/audit tables only, no * resource")
    def _():
        statements = role_statements(regional, "WorkerRole")
        for statement in statements:
            targets = statement.get("Resource", [])
            targets = targets if isinstance(targets, list) else [targets]
            actions = statement.get("Action", [])
            actions = set(actions if isinstance(actions, list) else [actions])
            # The SSM agent's channels: actions IAM scopes to no resource type, so "*" is theirs.
            unscopable = actions <= {a for a in SSM_AGENT_ACTIONS if a.split(":")[0] in ("ssmmessages", "ec2messages")}
            require("*" not in targets or unscopable, f"WorkerRole: a statement on Resource * ({statement.get('Action')})")
        return exact_grants(regional, facts, expected, statements, "WorkerRole")

    @check("the operator role can quarantine and lift (and nothing beyond the code's calls)")
    def _():
        needed = {kind: set() for kind in ("lease", "audit")}
        for function in ("quarantine", "release_quarantine", "verify_lease_table", "verify_audit_table"):
            require(function in facts["reach"], f"dynamodb.rs: no fn {function}")
            for action, kind in facts["reach"][function]:
                needed[kind].add(action)
        grants = dynamodb_grants(regional, facts, role_statements(regional, "OperatorRole"), "OperatorRole")
        tables = resources(regional, "AWS::DynamoDB::Table")
        for name, body in tables.items():
            kind = table_kind(facts, body["Properties"]["TableName"])
            have = grants.get(name, set())
            require(needed[kind] <= have, f"OperatorRole lacks {sorted(needed[kind] - have)} on {name}")
            require(have <= expected[kind], f"OperatorRole has {sorted(have - expected[kind])} on {name}, which the code never calls")
        return "needs " + describe(needed)

    @check("no role or managed policy in either template grants DynamoDB table administration or other tables")
    def _():
        count = 0
        for name_, template in templates.items():
            documents = [(n, b["Properties"]["PolicyDocument"]["Statement"])
                         for n, b in resources(template, "AWS::IAM::ManagedPolicy").items()]
            documents += [(f"{n}/{p['PolicyName']}", p["PolicyDocument"]["Statement"])
                          for n, b in resources(template, "AWS::IAM::Role").items() for p in b["Properties"].get("Policies", [])]
            for where, statements in documents:
                for table, actions in dynamodb_grants(template, facts, statements, f"{name_} {where}").items():
                    extra = actions - GENERATOR_ACTIONS
                    require(not extra, f"{name_} {where}: {sorted(extra)} on {table}")
                    count += 1
        return f"{count} table grants"

    @check("every host role reaches SSM through the agent's own calls only (no AmazonSSMManagedInstanceCore)")
    def _():
        roles = 0
        for name_, template in templates.items():
            for role in resources(template, "AWS::IAM::Role"):
                statements = role_statements(template, role)
                ssm = set()
                for statement in statements:
                    actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                    ssm |= {a for a in actions if a.split(":")[0] in ("ssm", "ssmmessages", "ec2messages")}
                require(ssm <= SSM_AGENT_ACTIONS, f"{name_} {role}: {sorted(ssm - SSM_AGENT_ACTIONS)} beyond the SSM agent's calls")
                roles += bool(ssm)
        return f"{roles} host roles, each with the agent's calls and no more"

    @check("the primary database admits the reader regions' hosts by a prefix list, never a whole CIDR")
    def _():
        rules = resources(global_, "AWS::EC2::SecurityGroupIngress")
        rule = rules.get("PublicIdsDbFromReaderRegions")
        require(rule, "global.yaml: no PublicIdsDbFromReaderRegions ingress")
        properties = rule["Properties"]
        require("CidrIp" not in properties, "PublicIdsDbFromReaderRegions admits a CIDR")
        require(ref(properties.get("SourcePrefixListId")) == "PublicIdsReaderRegionsPrefixList",
                "PublicIdsDbFromReaderRegions: SourcePrefixListId is not the PublicIdsReaderRegionsPrefixList parameter")
        return "SourcePrefixListId: PublicIdsReaderRegionsPrefixList"

    @check("every audit record the code puts is refused over an existing key (attribute_not_exists)")
    def _():
        audit = (root / "services/idgen/src/lease/dynamodb/audit.rs").read_text()
        puts = audit.count(".put_item()")
        guarded = len(re.findall(r'\.put_item\(\)(?:(?!\.send\(\)).)*?\.condition_expression\("attribute_not_exists\(event_key\)"\)', audit, re.S))
        require(puts >= 1 and puts == guarded, f"audit.rs: {puts} put_item calls, {guarded} with attribute_not_exists(event_key)")
        return f"{puts} put_item, each conditional"

    @check("every target group health-checks HTTP GET /healthz")
    def _():
        names = []
        for template in templates.values():
            for name, body in resources(template, "AWS::ElasticLoadBalancingV2::TargetGroup").items():
                props = body["Properties"]
                require(props.get("HealthCheckProtocol") == "HTTP", f"{name}: HealthCheckProtocol {props.get('HealthCheckProtocol')}")
                require(props.get("HealthCheckPath") == "/healthz", f"{name}: HealthCheckPath {props.get('HealthCheckPath')}")
                require(props.get("HealthCheckEnabled", True) is True, f"{name}: health checks disabled")
                names.append(name)
        require(names, "no target group")
        return ", ".join(names)

    @check("exactly three AZ Auto Scaling groups, one subnet each, the NLB in the same three, rolling one at a time")
    def _():
        groups = resources(regional, "AWS::AutoScaling::AutoScalingGroup")
        require(len(groups) == 3, f"{len(groups)} Auto Scaling groups")
        subnets = []
        for name, body in groups.items():
            props = body["Properties"]
            zone = props["VPCZoneIdentifier"]
            require(len(zone) == 1 and ref(zone[0]), f"{name}: VPCZoneIdentifier {zone} is not one subnet parameter")
            subnets.append(ref(zone[0]))
            for key in ("MinSize", "DesiredCapacity"):
                require(ref(props[key]) == "WorkersPerAz", f"{name}: {key} is not WorkersPerAz")
            rolling = body["UpdatePolicy"]["AutoScalingRollingUpdate"]
            require(int(rolling["MaxBatchSize"]) == 1, f"{name}: MaxBatchSize {rolling['MaxBatchSize']}")
            require(number(regional, rolling["MinInstancesInService"]) >= int(default(regional, "WorkersPerAz")) - 1,
                    f"{name}: MinInstancesInService below WorkersPerAz - 1")
            require(rolling.get("WaitOnResourceSignals") is True, f"{name}: does not wait for the new instance's signal")
        require(len(set(subnets)) == 3, f"the groups share subnets: {subnets}")
        for subnet in subnets:
            require(regional["Parameters"][subnet]["Type"] == "AWS::EC2::Subnet::Id", f"{subnet} is not a subnet parameter")
        (nlb,) = resources(regional, "AWS::ElasticLoadBalancingV2::LoadBalancer").values()
        require(sorted(ref(s) for s in nlb["Properties"]["Subnets"]) == sorted(subnets), "the NLB is not in the groups' three subnets")
        return ", ".join(f"{n}: {s}" for n, s in zip(groups, subnets))

    @check("capacity after losing one AZ carries the peak (2 x WorkersPerAz x InstanceRequestsPerSecond >= PeakRequestsPerSecond)")
    def _():
        per_az = int(default(regional, "WorkersPerAz"))
        each = int(default(regional, "InstanceRequestsPerSecond"))
        peak = int(default(regional, "PeakRequestsPerSecond"))
        require(2 * per_az * each >= peak, f"2 x {per_az} x {each} = {2 * per_az * each} < {peak}")
        return f"2 x {per_az} x {each} = {2 * per_az * each} >= {peak}, {100 * peak // (2 * per_az * each)}% busy"

    @check("the template's lease timing and shutdown grace defaults are the code's")
    def _():
        for parameter, key in (("LeaseMs", "lease_ms"), ("RenewIntervalMs", "renew_interval_ms"),
                               ("FenceMs", "fence_ms"), ("ShutdownGraceMs", "shutdown_grace_ms")):
            require(int(default(regional, parameter)) == facts[key],
                    f"{parameter} default {default(regional, parameter)}, code {key} = {facts[key]}")
        return ", ".join(f"{k} {facts[k]}" for k in ("lease_ms", "renew_interval_ms", "fence_ms", "shutdown_grace_ms"))

    @check("the NLB's deregistration delay is at least the worker's shutdown grace")
    def _():
        grace = int(default(regional, "ShutdownGraceMs"))
        for name, body in resources(regional, "AWS::ElasticLoadBalancingV2::TargetGroup").items():
            attributes = {a["Key"]: a["Value"] for a in body["Properties"].get("TargetGroupAttributes", [])}
            require("deregistration_delay.timeout_seconds" in attributes, f"{name}: no deregistration_delay.timeout_seconds")
            delay = number(regional, attributes["deregistration_delay.timeout_seconds"])
            require(delay * 1000 >= grace, f"{name}: {delay} s < shutdown grace {grace} ms")
        return f"{delay} s >= {grace} ms"

    for template_name, launch, marker, file in VERBATIM:
        @check(f"{file} is embedded byte for byte in {template_name} {launch}")
        def _(template_name=template_name, launch=launch, marker=marker, file=file):
            embedded = embedded_file(templates[template_name], template_name, launch, marker)
            wanted = (root / file).read_text()
            if embedded != wanted:
                a, b = embedded.splitlines(True), wanted.splitlines(True)
                line = next(i for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or a[i] != b[i])
                raise Failed(f"differs from line {line + 1}: embedded {a[line] if line < len(a) else '<end>'!r}, "
                             f"file {b[line] if line < len(b) else '<end>'!r}")
            return f"{len(wanted.encode())} bytes"

    @check("the worker host waits for chrony before starting the worker, as the unit does")
    def _():
        script = user_data(regional, "WorkerLaunchTemplate")
        unit = (root / "infra/systemd/idgen-worker.service").read_text()
        in_unit = re.search(r"^ExecStartPre=\S*chronyc (waitsync.*)$", unit, re.M)
        require(in_unit, "the unit has no ExecStartPre chronyc waitsync")
        wait = script.find("\nchronyc " + in_unit.group(1) + "\n")
        start = script.find("systemctl enable --now")
        require(wait >= 0, f"the user data does not run `chronyc {in_unit.group(1)}`")
        require(0 <= start and wait < start and "idgen-worker" in script[start:script.find("\n", start)],
                "the user data starts the worker before waiting for chrony")
        return f"chronyc {in_unit.group(1)}"

    @check("the registry and public-ID hosts initialize their database before starting the service, which never does")
    def _():
        found = []
        for launch, command, unit in [
            ("RegistryLaunchTemplate", "idgen registry init --config /etc/idgen/registry.toml", "idgen-registry"),
            ("PublicIdsLaunchTemplate", "idgen public init --config /etc/idgen/public-ids.toml", "idgen-public-ids"),
        ]:
            script = user_data(templates["global.yaml"], launch)
            init = script.find("/usr/local/bin/" + command)
            start = script.find("systemctl enable --now")
            require(init >= 0, f"{launch} does not run `{command}`")
            require(0 <= start and init < start and unit in script[start:script.find("\n", start)],
                    f"{launch} starts {unit} before `{command}`")
            require("RestartPreventExitStatus=2" in script, f"{launch}'s unit restarts a refused start (exit 2)")
            # Two roles: init as the master user (the schema's owner), the service as its own.
            database = {"idgen-registry": "RegistryDb", "idgen-public-ids": "PublicIdsDb"}[unit]
            master = templates["global.yaml"]["Resources"][database]["Properties"]["MasterUsername"]
            service_user = re.search(r'^database_url = "postgres://([^@"]+)@', script, re.M)
            require(service_user and service_user.group(1) != master,
                    f"{launch}: the service connects as the master user {master}, not a role of its own")
            owner = re.search(r"IDGEN_OWNER_DATABASE_URL='postgres://([^@']+)@", script[:init])
            require(owner and owner.group(1) == master, f"{launch}: init does not run as the master user {master}")
            found.append(f"{command.split(' --')[0]} as {master}, the service as {service_user.group(1)}")
        return ", ".join(found)

    for template_name, launch, marker, file in CONFIGS:
        @check(f"{file} is what {template_name} {launch} writes, with the example values")
        def _(template_name=template_name, launch=launch, marker=marker, file=file):
            embedded = embedded_file(templates[template_name], template_name, launch, marker)
            unresolved = re.findall(r"<unresolved [^>]*>", embedded)
            require(not unresolved, "values check_infra.py cannot resolve: " + ", ".join(unresolved))
            try:
                ours, theirs = tomllib.loads(embedded), tomllib.loads((root / file).read_text())
            except tomllib.TOMLDecodeError as error:
                raise Failed(f"not TOML: {error}")
            require(ours == theirs, "they differ: " + diff(ours, theirs))
            return f"{sum(1 for _ in leaves(theirs))} settings"

    def rendered_config(template_name, launch):
        text = embedded_file(templates[template_name], template_name, launch, "IDGEN_EOF_CONFIG")
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise Failed(f"{launch}: its configuration is not TOML: {error}")

    def port_of(address, what):
        match = re.fullmatch(r"[^\s]+:(\d+)", str(address))
        require(match, f"{what} {address!r} is not host:port")
        return int(match.group(1))

    @check("every NLB health check reaches its service's own plain health listener (health_listen), and no host runs a health proxy")
    def _():
        found = []
        for template_name, launch, _marker, _file in CONFIGS:
            template = templates[template_name]
            config = rendered_config(template_name, launch)
            listen = port_of(config.get("listen"), f"{launch} listen")
            require("health_listen" in config, f"{launch}: the configuration sets no health_listen, the NLB's health check has nothing to reach")
            health = port_of(config["health_listen"], f"{launch} health_listen")
            require(health != listen, f"{launch}: health_listen shares the service's port {listen}")
            groups = [(name, body["Properties"]) for name, body in resources(template, "AWS::ElasticLoadBalancingV2::TargetGroup").items()
                      if number(template, body["Properties"]["Port"]) == listen]
            require(len(groups) == 1, f"{launch}: {len(groups)} target groups forward to port {listen} (expected one)")
            (name, props), = groups
            checked = number(template, props.get("HealthCheckPort", props["Port"]))
            require(checked == health, f"{name}: health checks port {checked}, {launch}'s health_listen is {health}")
            script = user_data(template, launch)
            require("health-proxy" not in script and "HEALTH_PROXY" not in script, f"{launch}: the user data still installs a health proxy")
            found.append(f"{name} -> {health}")
        return ", ".join(found)

    @check("every service unit's LimitNOFILE is above twice its [limits] max_connections plus its other files")
    def _():
        default_cap = facts["max_connections"]
        found = []
        for template_name, launch in UNITS:
            unit = embedded_file(templates[template_name], template_name, launch, "IDGEN_EOF_UNIT")
            limit = re.search(r"^LimitNOFILE=(\d+)$", unit, re.M)
            require(limit, f"{launch}: its unit sets no LimitNOFILE (the default soft limit, 1024, is below the connection cap)")
            config = rendered_config(template_name, launch)
            cap = int(config.get("limits", {}).get("max_connections", default_cap))
            need = 2 * cap + OTHER_FILES
            require(int(limit.group(1)) >= need, f"{launch}: LimitNOFILE={limit.group(1)} < 2 x {cap} + {OTHER_FILES}")
            found.append(f"{launch} {limit.group(1)} >= {need}")
        return ", ".join(found)

    for template_name, launch, marker, file in CONFIGS:
        @check(f"every /etc/idgen/tls/ file {file} names is written on {template_name} {launch} (by the TLS fetcher or a download)")
        def _(template_name=template_name, launch=launch, marker=marker, file=file):
            script = user_data(templates[template_name], launch)
            named = sorted(set(re.findall(r"/etc/idgen/tls/([A-Za-z0-9._-]+)", heredoc(script, marker))))
            fetch = re.search(r'^TLS_FETCH="/usr/local/sbin/idgen-tls-fetch (\S+ ){3}([^"]*)"$', script, re.M)
            require(fetch, f"{launch}: no TLS_FETCH line")
            written = set(fetch.group(2).split())
            written |= set(re.findall(r"-o /etc/idgen/tls/([A-Za-z0-9._-]+)", script))
            missing = [name for name in named if name not in written]
            require(not missing, f"{file} names files the host never writes: {', '.join(missing)} "
                                 "(a start, or a SIGHUP, would refuse the missing file)")
            return ", ".join(named)

    @check("the TLS fetcher is the same on every host")
    def _():
        for marker in SHARED_SCRIPTS:
            copies = {(n, lt): heredoc(user_data(t, lt), marker)
                      for n, t in templates.items() for lt in resources(t, "AWS::EC2::LaunchTemplate")}
            require(len(set(copies.values())) == 1, f"{marker} differs between " + ", ".join(f"{n} {lt}" for n, lt in copies))
        return f"{len(copies)} launch templates"

    @check("every parameter with an AllowedPattern takes its default and the example its description gives")
    def _():
        found = []
        for name_, template in templates.items():
            for key, parameter in template.get("Parameters", {}).items():
                pattern = parameter.get("AllowedPattern")
                if pattern is None:
                    continue
                if "Default" in parameter:
                    require(re.fullmatch(pattern, str(parameter["Default"])), f"{name_} {key}: its default does not match {pattern}")
                example = re.search(r"e\.g\. (.*?)(;|$)", parameter.get("Description", ""))
                if example:
                    require(re.fullmatch(pattern, example.group(1)), f"{name_} {key}: its example {example.group(1)!r} does not match {pattern}")
                found.append(key + (" (and its example)" if example else ""))
        return ", ".join(found)

    @check("every launch template: AL2023 arm64 from SSM, IMDSv2 required, encrypted volumes, never hibernated")
    def _():
        count = 0
        for name_, template in templates.items():
            for name, body in resources(template, "AWS::EC2::LaunchTemplate").items():
                data = body["Properties"]["LaunchTemplateData"]
                image = ref(data["ImageId"])
                require(image and default(template, image) == AMI_PARAMETER, f"{name_} {name}: ImageId is not {AMI_PARAMETER}")
                require(data.get("MetadataOptions", {}).get("HttpTokens") == "required", f"{name_} {name}: IMDSv2 not required")
                require(data.get("HibernationOptions", {}).get("Configured") is False,
                        f"{name_} {name}: HibernationOptions.Configured is not false (a resumed memory image is the same holder twice)")
                volumes = data.get("BlockDeviceMappings", [])
                require(volumes and all(v["Ebs"].get("Encrypted") is True for v in volumes), f"{name_} {name}: a volume is not encrypted")
                count += 1
        return f"{count} launch templates"

    @check("the public-ID KMS key: rotation on, only the public-ID service's role may GenerateDataKey/Decrypt "
           "(under the service's encryption context) and ReEncrypt, the reader regions' role Decrypt only")
    def _():
        key = global_["Resources"]["PublicIdsKey"]["Properties"]
        require(key.get("EnableKeyRotation") is True, "EnableKeyRotation is not true")
        using = ("kms:*", "kms:decrypt", "kms:generatedatakey", "kms:encrypt", "kms:reencrypt", "kms:creategrant")
        users = {"PublicIdsKmsRole": set(), "PublicIdsReaderRole": set()}
        # A statement under Fn::If is checked in both its forms.
        statements = []
        for statement in key["KeyPolicy"]["Statement"]:
            branches = statement["Fn::If"][1:] if set(statement) == {"Fn::If"} else [statement]
            statements += [b for b in branches if b != {"Ref": "AWS::NoValue"}]
        for statement in statements:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if statement["Effect"] != "Allow" or not any(a.lower().startswith(using) for a in actions):
                continue
            principal = statement["Principal"].get("AWS") if isinstance(statement["Principal"], dict) else statement["Principal"]
            attribute = principal.get("Fn::GetAtt") if isinstance(principal, dict) else None
            role = attribute[0] if attribute and len(attribute) == 2 and attribute[1] == "Arn" else None
            require(role in users, f"statement {statement.get('Sid')} lets {principal!r} use the key ({', '.join(actions)})")
            context = statement.get("Condition", {}).get("StringEquals", {}).get("kms:EncryptionContext:service")
            if role == "PublicIdsReaderRole":
                require(actions == ["kms:Decrypt"] and context == "idgen-public-ids",
                        f"statement {statement.get('Sid')} lets the reader regions' role do {actions} "
                        f"under the context {context!r} (Decrypt only, under the service's)")
            # What hands out a plaintext data key is held to the service's encryption context.
            plaintext = {"kms:Decrypt", "kms:GenerateDataKey"} & set(actions)
            require(not plaintext or context == "idgen-public-ids",
                    f"statement {statement.get('Sid')} allows {sorted(plaintext)} under the context {context!r}")
            users[role].update(actions)
        require(users["PublicIdsKmsRole"] == {"kms:GenerateDataKey", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo"},
                f"the public-ID service's role has {sorted(users['PublicIdsKmsRole'])}")
        require(users["PublicIdsReaderRole"] == {"kms:Decrypt"}, f"the reader regions' role has {sorted(users['PublicIdsReaderRole'])}")
        return "; ".join(f"{role}: " + ", ".join(sorted(actions)) for role, actions in users.items())

    @check("no registry or public-ID service process can take its host role's credentials (which read the "
           "database's master secret): each unit denies the instance metadata service, and the public-ID service "
           "gets KMS through a role of its own that only its host role may assume")
    def _():
        deny = "IPAddressDeny=169.254.169.254/32 fd00:ec2::254/128"
        found = []
        for launch, example in (("RegistryLaunchTemplate", None), ("PublicIdsLaunchTemplate", None),
                                ("PublicIdsLaunchTemplate", READER_EXAMPLE)):
            unit = embedded_file(global_, "global.yaml", launch, "IDGEN_EOF_UNIT", example)
            require(deny in unit.splitlines(), f"{launch}: the service's unit does not say {deny}")
            found.append(launch)
        for example in (None, READER_EXAMPLE):
            script = rendered_user_data(global_, "global.yaml", "PublicIdsLaunchTemplate", example)
            unit = heredoc(script, "IDGEN_EOF_UNIT")
            require("EnvironmentFile=/etc/idgen/public-ids-aws.env" in unit.splitlines(),
                    "the public-ID service's unit does not read its AWS settings (public-ids-aws.env)")
            settings = heredoc(script, "IDGEN_EOF_AWS_ENV").splitlines()
            require("AWS_EC2_METADATA_DISABLED=true" in settings and "AWS_CONFIG_FILE=/etc/idgen/public-ids-aws.config" in settings,
                    f"public-ids-aws.env: {settings}")
            init = heredoc(script, "IDGEN_EOF_INIT") if "IDGEN_EOF_INIT" in script else ""
            require(not init or ". /etc/idgen/public-ids-aws.env" in init.splitlines(),
                    "idgen-init does not use the service's AWS credentials")
        trust = global_["Resources"]["PublicIdsKmsRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        require(trust == [{"Effect": "Allow", "Principal": {"AWS": {"Fn::GetAtt": ["PublicIdsRole", "Arn"]}},
                           "Action": "sts:AssumeRole"}], f"PublicIdsKmsRole's trust policy: {trust}")
        extra = role_statements(global_, "PublicIdsKmsRole")
        require(not extra, f"PublicIdsKmsRole carries an IAM policy (the key policy alone grants it KMS): {extra}")
        for role in ("PublicIdsRole", "RegistryRole"):
            kms = [s.get("Sid") for s in role_statements(global_, role)
                   if any(str(a).lower().startswith(("kms:generatedatakey", "kms:reencrypt", "kms:*"))
                          for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]]))]
            require(not kms, f"{role} may use a KMS key for itself: {kms}")
        return ", ".join(found) + " deny the metadata service; the public-ID service's KMS role is assumed only by PublicIdsRole"

    @check("a reader region's stack (Deployment=public-ids-reader) holds only its public-ID service, on a cross-region replica of the home primary")
    def _():
        reader = present(global_, READER_EXAMPLE)
        home = present(global_, HOME_WITH_READERS)
        # Beyond the home stack's resources, a reader region has only its way to the home primary
        # and its grants to the home stack's reader role.
        extra = sorted(set(reader) - set(home) - {"PublicIdsToPrimary", "PublicIdsReaderPolicy"})
        require(not extra, f"a reader region creates what the home region does not: {extra}")
        held = sorted(name for name in reader if name.startswith("Registry") or name in HOME_ONLY)
        require(not held, f"a reader region's stack holds {', '.join(held)}")
        for name in HOME_ONLY:
            require(name in home, f"the home stack (with reader regions) holds no {name}")
        require(not [n for n, b in reader.items() if b["Type"] == "AWS::IAM::Role" and n != "RdsMonitoringRole"],
                "a reader region makes a host role of its own")
        profile = value_of(global_, READER_EXAMPLE, reader["PublicIdsInstanceProfile"]["Properties"]["Roles"][0])
        require(profile == READER_EXAMPLE["PublicIdsReaderRoleName"], f"the reader hosts' instance profile holds {profile!r}")
        # Its grants: only to that role, each usable only from its own VPC.
        policy = reader["PublicIdsReaderPolicy"]["Properties"]
        require([value_of(global_, READER_EXAMPLE, r) for r in policy["Roles"]] == [READER_EXAMPLE["PublicIdsReaderRoleName"]],
                "PublicIdsReaderPolicy is not attached to PublicIdsReaderRoleName alone")
        for statement in policy["PolicyDocument"]["Statement"]:
            vpc = statement.get("Condition", {}).get("StringEquals", {}).get("aws:Ec2InstanceSourceVpc")
            require(vpc == {"Ref": "VpcId"}, f"PublicIdsReaderPolicy {statement.get('Sid')}: usable from outside this region's VPC")
        replica = reader["PublicIdsDbReader"]["Properties"]
        source = value_of(global_, READER_EXAMPLE, replica["SourceDBInstanceIdentifier"])
        require(source == READER_EXAMPLE["PublicIdsSourceDbArn"], f"the replica streams from {source!r}, not PublicIdsSourceDbArn")
        region = value_of(global_, READER_EXAMPLE, replica.get("SourceRegion", {"Ref": "AWS::NoValue"}))
        require(region == READER_EXAMPLE["PublicIdsPrimaryRegion"], f"the replica's SourceRegion is {region!r}, not PublicIdsPrimaryRegion")
        key = value_of(global_, READER_EXAMPLE, replica.get("KmsKeyId", {"Ref": "AWS::NoValue"}))
        require(key == "<unresolved DataKey.Arn>", f"the cross-region replica is encrypted under {key!r}, not this region's DataKey")
        subnets = value_of(global_, READER_EXAMPLE, replica.get("DBSubnetGroupName", {"Ref": "AWS::NoValue"}))
        require(subnets == "<unresolved DbSubnetGroup>", f"the cross-region replica's subnets are {subnets!r}, not this stack's")
        at_home = value_of(global_, HOME_WITH_READERS, replica["SourceDBInstanceIdentifier"])
        require(at_home == "<unresolved PublicIdsDb>", f"the home region's replica streams from {at_home!r}, not PublicIdsDb")
        return (f"{len(reader)} resources against the home stack's {len(home)}; the replica streams from PublicIdsSourceDbArn "
                f"in PublicIdsPrimaryRegion; the hosts run as PublicIdsReaderRoleName, granted this region's resources from its VPC only")

    @check("a reader region's public-ID hosts write infra/config/public-ids.toml but for read_database_url (the region's replica), and never initialize the database")
    def _():
        name, launch = "global.yaml", "PublicIdsLaunchTemplate"
        home = tomllib.loads((root / "infra/config/public-ids.toml").read_text())
        text = embedded_file(global_, name, launch, "IDGEN_EOF_CONFIG", READER_EXAMPLE)
        unresolved = re.findall(r"<unresolved [^>]*>", text)
        require(not unresolved, "values check_infra.py cannot resolve: " + ", ".join(unresolved))
        reader = tomllib.loads(text)
        differ = differing(reader, home)
        require(differ == ["read_database_url"], "they differ in " + diff(reader, home) if differ else "they do not differ")
        replica = READER_EXAMPLE["PublicIdsDbReader.Endpoint.Address"]
        require(f"@{replica}:" in reader["read_database_url"], f"read_database_url {reader['read_database_url']!r} is not the region's replica")
        for example, owner in ((READER_EXAMPLE, False), (EXAMPLE_VALUES[name], True)):
            script = rendered_user_data(global_, name, launch, example)
            secret = re.search(r"^OWNER_SECRET='([^']*)'$", script, re.M)
            require(secret, "the user data sets no OWNER_SECRET")
            require(bool(secret.group(1)) == owner,
                    f"OWNER_SECRET is {secret.group(1)!r} in the {'home' if owner else 'reader'} region")
            # Every line that writes or runs idgen-init is inside one `if [ -n "$OWNER_SECRET" ]` block.
            guarded = re.compile(r'^if \[ -n "\$OWNER_SECRET" \]; then\n(.*?)^fi$', re.M | re.S)
            blocks, outside = guarded.findall(script), guarded.sub("", script)
            require(any("cat > /usr/local/sbin/idgen-init" in b and "\n/usr/local/sbin/idgen-init\n" in b for b in blocks)
                    and not [line for line in outside.splitlines() if "idgen-init" in line and not line.lstrip().startswith("#")],
                    'idgen-init is written or run outside `if [ -n "$OWNER_SECRET" ]`')
        return f"read_database_url on {replica}; creates, and what the replica misses, on {READER_EXAMPLE['PublicIdsPrimaryAddress']}"

    @check("every launch template's user data, rendered, fits EC2's 16 KB (before base64), in every deployment")
    def _():
        found = []
        for name_, template in templates.items():
            for example in [None] + ([READER_EXAMPLE] if name_ == "global.yaml" else []):
                created = present(template, EXAMPLE_VALUES.get(name_, {}) if example is None else example)
                for launch in resources(template, "AWS::EC2::LaunchTemplate"):
                    if launch not in created:
                        continue
                    size = len(rendered_user_data(template, name_, launch, example).encode())
                    where = f"{launch}{' (reader region)' if example else ''}"
                    require(size <= 16384, f"{name_} {where}: {size} bytes")
                    found.append(f"{where} {size}")
        return ", ".join(found)

    @check("every alarm's description names its runbook page (runbooks/<page>.md)")
    def _():
        written = {p.stem for p in (root / "runbooks").glob("*.md")} - {"README"}
        pages = {}
        for template in templates.values():
            for name, body in resources(template, "AWS::CloudWatch::Alarm").items():
                page = re.search(r"runbooks/([a-z0-9-]+)\.md", str(body["Properties"].get("AlarmDescription", "")))
                require(page, f"{name}: AlarmDescription names no runbooks/<page>.md")
                require(page.group(1) in written, f"{name}: runbooks/{page.group(1)}.md does not exist")
                pages.setdefault(page.group(1), []).append(name)
        return f"{sum(map(len, pages.values()))} alarms, {len(pages)} pages, every one written"

    failed = RESULTS.count(False)
    print(f"{'FAILED' if failed else 'passed'}: {len(RESULTS) - failed} of {len(RESULTS)} checks passed")
    return 1 if failed else 0


def exact_grants(template, facts, expected, statements, where):
    grants = dynamodb_grants(template, facts, statements, where)
    for name, body in resources(template, "AWS::DynamoDB::Table").items():
        kind = table_kind(facts, body["Properties"]["TableName"])
        have = grants.get(name, set())
        require(have == expected[kind],
                f"{name}: grants {sorted(have)}, the code calls {sorted(expected[kind])} on {kind} tables"
                + (f" (missing {sorted(expected[kind] - have)})" if expected[kind] - have else "")
                + (f" (extra {sorted(have - expected[kind])})" if have - expected[kind] else ""))
    return describe(expected)


def leaves(tree, prefix=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix, tree


def differing(ours, theirs):
    """The dotted keys whose values differ between two TOML trees (absent on one side counts)."""
    a, b = dict(leaves(ours)), dict(leaves(theirs))
    return sorted(k for k in set(a) | set(b) if a.get(k, object()) != b.get(k, object()))


def diff(ours, theirs):
    a, b = dict(leaves(ours)), dict(leaves(theirs))
    return "; ".join(f"{k}: template {a.get(k, '<absent>')!r}, file {b.get(k, '<absent>')!r}" for k in differing(ours, theirs))


if __name__ == "__main__":
    sys.exit(main())
