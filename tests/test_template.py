"""template.yaml agrees with the code: runtimes, tracing, routes and their auth, least-privilege IAM,
dreaming timings, the dead-letter queue, the migration custom resource, and that every environment
variable it sets is one the code reads (eros.config.Settings) or a Powertools one."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from eros.config import Settings
from eros_dev.server import PUBLIC_ROUTES, SERVER_PREFIX

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = ("ChatFunction", "ChatStreamFunction", "SweeperFunction", "ExtractFunction", "MigrateFunction")
# Each function's handler; the stream function's module is beside the chat function's app.py (one CodeUri).
HANDLERS = {name: "app.lambda_handler" for name in FUNCTIONS} | {"ChatStreamFunction": "stream.lambda_handler"}
# The layers and the folders they are built from: ErosLayer for every function, AuthLayer (PyJWT with cryptography,
# ~15 MB) for the stream function alone, the one that verifies tokens itself (eros.auth).
LAYERS = {"ErosLayer": "layers/eros", "AuthLayer": "layers/auth"}
FUNCTION_LAYERS = {name: ["ErosLayer"] for name in FUNCTIONS} | {"ChatStreamFunction": ["ErosLayer", "AuthLayer"]}
# Resources SAM makes of a function's properties (a function URL), by the function they come with.
SAM_GENERATED = {"ChatStreamFunctionUrl": "ChatStreamFunction"}
SAM_MANAGED_POLICIES = {  # what SAM attaches for a function with tracing and a VPC; nothing else
    "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
    "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess",
    "arn:aws:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole",
}


class CfnLoader(yaml.SafeLoader):
    """A SafeLoader that turns CloudFormation short tags (!Ref, !GetAtt, !Sub, ...) into their long form."""


def _intrinsic(loader: CfnLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        assert isinstance(node, yaml.MappingNode), node
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


CfnLoader.add_multi_constructor("!", _intrinsic)


@pytest.fixture(scope="module")
def template() -> dict:
    return yaml.load((ROOT / "template.yaml").read_text(), Loader=CfnLoader)


def resource(template: dict, name: str) -> dict:
    return template["Resources"][name]


def props(template: dict, name: str) -> dict:
    return resource(template, name).get("Properties", {})


def function_setting(template: dict, name: str, key: str):
    """A function property as deployed: the function's own value, else the Globals one; a list is the Globals'
    followed by the function's own (SAM concatenates them: a function's Layers add to the Globals' layers)."""
    own, common = props(template, name).get(key), template["Globals"]["Function"].get(key)
    if isinstance(own, list) and isinstance(common, list):
        return common + own
    return common if own is None else own


def statements(template: dict, name: str) -> list[dict]:
    policies = props(template, name).get("Policies", [])
    assert isinstance(policies, list)
    out = []
    for policy in policies:
        # Inline statements only: no SAM policy templates or managed policy names, which hide wildcards.
        assert isinstance(policy, dict) and set(policy) == {"Statement"}, f"{name}: non-inline policy {policy}"
        out.extend(policy["Statement"])
    return out


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


# --- the template as CloudFormation evaluates it for given parameter values -----------------------------------
def parameter_values(template: dict, **given) -> dict[str, Any]:
    """Every parameter's value: the given ones, else the template's defaults (as CloudFormation sees them)."""
    unknown = set(given) - set(template["Parameters"])
    assert not unknown, unknown
    return {name: str(given.get(name, spec.get("Default", ""))) for name, spec in template["Parameters"].items()}


def conditions(template: dict, **given) -> dict[str, bool]:
    """Each condition's value for those parameters (the intrinsics conditions use: Equals, Not, And, Or)."""
    values = parameter_values(template, **given)
    done: dict[str, bool] = {}

    def value(node) -> Any:
        if isinstance(node, dict) and set(node) == {"Ref"}:
            return values[node["Ref"]]
        if isinstance(node, dict) and set(node) == {"Fn::Join"}:
            sep, parts = node["Fn::Join"]
            return sep.join(value(p) for p in (parts if isinstance(parts, list) else [value(parts)]))
        if isinstance(node, dict) and set(node) & {"Condition", "Fn::Condition"}:  # long form, or the loader's
            return condition(next(iter(node.values())))
        if isinstance(node, dict):
            [(fn, args)] = node.items()
            if fn == "Fn::Equals":
                return str(value(args[0])) == str(value(args[1]))
            results = [bool(value(arg)) for arg in args]
            return {"Fn::Not": not results[0], "Fn::And": all(results), "Fn::Or": any(results)}[fn]
        return node

    def condition(name: str) -> bool:
        if name not in done:
            done[name] = bool(value(template["Conditions"][name]))
        return done[name]

    return {name: condition(name) for name in template["Conditions"]}


def resolved(template: dict, node, **given):
    """``node`` with every Fn::If decided (and AWS::NoValue dropped) for those parameters."""
    decided = conditions(template, **given)

    def walk(n):
        if isinstance(n, dict) and set(n) == {"Fn::If"}:
            name, yes, no = n["Fn::If"]
            return walk(yes if decided[name] else no)
        if isinstance(n, dict):
            out = {k: walk(v) for k, v in n.items()}
            return {k: v for k, v in out.items() if v != {"Ref": "AWS::NoValue"}}
        if isinstance(n, list):
            return [walk(v) for v in n if walk(v) != {"Ref": "AWS::NoValue"}]
        return n

    return walk(node)


def created(template: dict, **given) -> set[str]:
    """The resources a stack gets for those parameters."""
    decided = conditions(template, **given)
    return {name for name, r in template["Resources"].items() if decided.get(r.get("Condition", ""), True)}


def http_events(template: dict) -> dict[str, dict]:
    events = props(template, "ChatFunction")["Events"]
    return {name: e["Properties"] for name, e in events.items() if e["Type"] == "HttpApi"}


# --- runtime and observability ----------------------------------------------------------------
def test_every_function_is_python312_of_the_architecture_parameter_with_active_tracing(template):
    functions = [n for n, r in template["Resources"].items() if r["Type"] == "AWS::Serverless::Function"]
    assert sorted(functions) == sorted(FUNCTIONS)
    architecture = template["Parameters"]["Architecture"]
    assert architecture["Default"] == "arm64" and set(architecture["AllowedValues"]) == {"arm64", "x86_64"}
    for layer in LAYERS:
        assert props(template, layer)["CompatibleArchitectures"] == [{"Ref": "Architecture"}], layer
        assert resource(template, layer)["Metadata"]["BuildArchitecture"] == {"Ref": "Architecture"}, layer
    # sam build does not tell the layer's makefile the architecture: the Makefile builds both with one value.
    makefile = (ROOT / "Makefile").read_text()
    assert "export LAMBDA_ARCH := $(ARCH)" in makefile and "--parameter-overrides Architecture=$(ARCH)" in makefile
    assert "--cache-dir .aws-sam/cache-$(ARCH)" in makefile  # a cached layer of the other architecture is not reused
    for name in functions:
        assert function_setting(template, name, "Runtime") == "python3.12", name
        assert function_setting(template, name, "Architectures") == [{"Ref": "Architecture"}], name
        assert function_setting(template, name, "Tracing") == "Active", name
        assert function_setting(template, name, "Handler") == HANDLERS[name], name
        assert function_setting(template, name, "Layers") == [{"Ref": layer} for layer in FUNCTION_LAYERS[name]], name
        vpc = function_setting(template, name, "VpcConfig")
        assert vpc == {"SubnetIds": {"Fn::If": ["OwnDatabase", [{"Ref": "PrivateSubnetA"}, {"Ref": "PrivateSubnetB"}],
                                                {"Ref": "SubnetIds"}]},
                       "SecurityGroupIds": {"Fn::If": ["OwnDatabase", [{"Ref": "FunctionSecurityGroup"}],
                                                       {"Ref": "SecurityGroupIds"}]}}, name
        code = ROOT / props(template, name)["CodeUri"]
        module = HANDLERS[name].rpartition(".")[0]
        assert (code / f"{module}.py").is_file() and (code / "requirements.txt").is_file(), name


def test_the_layer_is_built_for_python312_from_the_eros_package(template):
    layer = resource(template, "ErosLayer")
    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    assert layer["Properties"]["ContentUri"].rstrip("/") == "layers/eros"
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.12"]
    # layers/eros/Makefile: the locked versions, compiled (tests/test_packaging.py checks the lock).
    assert layer["Metadata"]["BuildMethod"] == "makefile"
    content = ROOT / "layers/eros"
    assert "build-ErosLayer:" in (content / "Makefile").read_text()
    assert (content / "requirements.lock").is_file() and (content / "eros/__init__.py").is_file()
    assert list((content / "eros/migrations").glob("*.sql")) and list((content / "eros/personas").glob("*.json"))
    assert list((content / "eros/sql/functions").glob("*.sql"))  # the functions' current definitions


def test_the_stream_functions_token_layer_is_built_like_the_shared_one_without_code(template):
    """AuthLayer: PyJWT[crypto] at the locked versions for the Architecture, compiled (layers/auth/Makefile);
    tests/test_packaging.py checks its lock, tests/test_layer_build.py its platform."""
    layer = resource(template, "AuthLayer")
    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    assert layer["Properties"]["ContentUri"].rstrip("/") == LAYERS["AuthLayer"]
    assert layer["Properties"]["CompatibleRuntimes"] == props(template, "ErosLayer")["CompatibleRuntimes"]
    assert layer["Properties"]["RetentionPolicy"] == props(template, "ErosLayer")["RetentionPolicy"]
    assert layer["Metadata"]["BuildMethod"] == "makefile"
    content = ROOT / LAYERS["AuthLayer"]
    makefile = (content / "Makefile").read_text()
    assert "build-AuthLayer:" in makefile and "--require-hashes" in makefile and "-r requirements.lock" in makefile
    assert "cp -R" not in makefile and not list(content.rglob("*.py"))  # no code of this repository in it
    assert (content / "requirements.lock").is_file()


def test_only_the_stream_function_loads_the_token_layer(transformed):
    """As deployed (SAM adds a function's Layers to the Globals'): the stream function has both layers, ErosLayer
    first, each once; every other function ErosLayer alone."""
    resources = transformed["Resources"]
    logical = {n: r for n, r in resources.items() if r["Type"] == "AWS::Lambda::LayerVersion"}
    named = {layer: [n for n in logical if n.startswith(layer)] for layer in LAYERS}  # SAM adds a content hash
    assert all(len(found) == 1 for found in named.values()) and len(logical) == len(LAYERS), named
    for name in FUNCTIONS:
        layers = resources[name]["Properties"]["Layers"]
        assert layers == [{"Ref": named[layer][0]} for layer in FUNCTION_LAYERS[name]], name


def test_powertools_is_configured_for_every_function(template):
    from eros.observability import SERVICE, metrics

    env = template["Globals"]["Function"]["Environment"]["Variables"]
    assert env["POWERTOOLS_LOG_LEVEL"] == {"Ref": "LogLevel"}
    # Service and namespace are the code's constants: a variable for them would be set and never read.
    assert "POWERTOOLS_SERVICE_NAME" not in env and "POWERTOOLS_METRICS_NAMESPACE" not in env
    assert (SERVICE, metrics.provider.namespace) == ("eros", "Eros")


# --- the API ----------------------------------------------------------------------------------
def test_public_routes_are_exactly_the_local_servers(template):
    """Every route without the JWT authorizer is public (as the local server's) or an app's servers' (under
    /server, the key checked in the function): nothing else goes around the authorizer."""
    unauthorized = {(p["Method"].upper(), p["Path"]) for p in http_events(template).values()
                    if p.get("Auth", {}).get("Authorizer") == "NONE"}
    keyed = {route for route in unauthorized if route[1].startswith(SERVER_PREFIX)}
    assert unauthorized - keyed == set(PUBLIC_ROUTES)
    assert keyed == {("ANY", SERVER_PREFIX + "{proxy+}")}


def test_the_server_routes_are_the_ones_whose_api_key_the_function_checks(template):
    """/server/... goes around the JWT authorizer (template.yaml) because the chat function checks the app's API key
    on exactly that prefix (functions/chat/app.py) and the local server lets exactly that prefix through: a
    route of that prefix the function did not check would be public."""
    from eros_dev.lambda_runtime import load_function

    assert SERVER_PREFIX == load_function("chat").SERVER + "/"
    assert not any(path.startswith(SERVER_PREFIX) for _, path in PUBLIC_ROUTES)


def test_the_functions_that_read_tokens_read_the_app_claim_the_stack_is_given(template):
    assert template["Parameters"]["AppClaim"]["Default"] == Settings.model_fields["app_claim"].default
    for name in ("ChatFunction", "ChatStreamFunction"):
        assert props(template, name)["Environment"]["Variables"]["APP_CLAIM"] == {"Ref": "AppClaim"}, name
    groups = template["Metadata"]["AWS::CloudFormation::Interface"]["ParameterGroups"]
    assert any("AppClaim" in g["Parameters"] and "JwtIssuer" in g["Parameters"] for g in groups)


def test_every_other_route_goes_through_the_jwt_authorizer(template):
    events = http_events(template)
    assert all(p["ApiId"] == {"Ref": "ChatApi"} for p in events.values())
    private = [p for p in events.values() if p.get("Auth", {}).get("Authorizer") != "NONE"]
    assert [(p["Method"], p["Path"]) for p in private] == [("ANY", "/{proxy+}")]
    assert all("Auth" not in p for p in private)  # the default authorizer, not an override
    assert all(e["Type"] == "HttpApi" for e in props(template, "ChatFunction")["Events"].values())


def test_the_jwt_authorizer_is_the_apis_default(template):
    api = resource(template, "ChatApi")
    assert api["Type"] == "AWS::Serverless::HttpApi"
    auth = api["Properties"]["Auth"]
    authorizer = auth["Authorizers"][auth["DefaultAuthorizer"]]
    assert authorizer["IdentitySource"] == "$request.header.Authorization"
    assert authorizer["JwtConfiguration"] == {  # the given issuer, else the stack's own Cognito user pool
        "issuer": {"Fn::If": ["OwnUserPool", {"Fn::GetAtt": ["UserPool", "ProviderURL"]}, {"Ref": "JwtIssuer"}]},
        "audience": {"Fn::If": ["OwnUserPool", [{"Ref": "UserPoolClient"}], {"Ref": "JwtAudience"}]}}
    assert template["Parameters"]["JwtAudience"]["Type"] == "CommaDelimitedList"
    assert "ChatApi" in json.dumps(template["Outputs"]["ApiUrl"]["Value"])


def test_the_chat_turn_fits_in_api_gateways_time(template):
    chat = props(template, "ChatFunction")
    budget = float(chat["Environment"]["Variables"]["TURN_BUDGET_SECS"])
    assert chat["Timeout"] <= 29
    assert budget == Settings().turn_budget_secs and budget < chat["Timeout"]


def test_a_spend_reservation_outlives_the_request_that_made_it(template):
    """A reservation (migration 0018) that expired under a live turn or memory request would let its tokens be
    spent twice over; one that a killed container leaves must lapse soon. Lambda kills the chat function at its
    Timeout, so a reservation lasts longer than that, and not much longer."""
    from eros.store.usage import RESERVATION_SECS

    for name in ("ChatFunction", "ChatStreamFunction"):
        assert props(template, name)["Timeout"] < RESERVATION_SECS <= 120, name


# --- IAM --------------------------------------------------------------------------------------
def test_no_wildcard_actions_or_resources(template):
    for name in FUNCTIONS:
        for statement in statements(template, name):
            assert statement["Effect"] == "Allow"
            assert all("*" not in action for action in as_list(statement["Action"])), (name, statement)
            assert all(r != "*" and "*" not in json.dumps(r) for r in as_list(statement["Resource"])
                       if r != EXPORT_OBJECTS), (name, statement)


# The one wildcard a function's role has: the chat function's export objects, named at random under a prefix.
EXPORT_OBJECTS = {"Fn::Sub": "${ExportBucket.Arn}/exports/*"}


def test_exports_are_private_encrypted_tls_only_expiring_and_only_the_chat_function_reaches_them(template):
    bucket = props(template, "ExportBucket")
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
    assert all(bucket["PublicAccessBlockConfiguration"].values()) and len(bucket["PublicAccessBlockConfiguration"]) == 4
    [rule] = bucket["LifecycleConfiguration"]["Rules"]
    assert (rule["Prefix"], rule["ExpirationInDays"], rule["AbortIncompleteMultipartUpload"]) == (
        "exports/", 1, {"DaysAfterInitiation": 1})
    [deny] = props(template, "ExportBucketPolicy")["PolicyDocument"]["Statement"]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": False}}
    assert environment(template, "ChatFunction")["EXPORT_BUCKET"] == {"Ref": "ExportBucket"}
    reaching = {name for name in FUNCTIONS for st in statements(template, name) if "ExportBucket" in json.dumps(st)}
    assert reaching == {"ChatFunction"}
    [listing] = [st for st in statements(template, "ChatFunction") if st.get("Sid") == "ListAUsersExports"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": "exports/*"}}


APP_SECRET = {"Ref": "AppDatabaseSecret"}
ADMIN_SECRET = {"Fn::If": ["OwnDatabase", {"Fn::GetAtt": ["AuroraCluster", "MasterUserSecret.SecretArn"]},
                           {"Ref": "DatabaseSecretArn"}]}  # RDS-managed and rotated, or the one given
PROVIDER_SECRET = {"Fn::If": ["OwnProviderSecret", {"Ref": "ProviderSecret"}, {"Ref": "ProviderSecretArn"}]}


def environment(template: dict, name: str) -> dict:
    """A function's environment as deployed: Globals' variables, overridden by its own (SAM merges them)."""
    return {**template["Globals"]["Function"]["Environment"]["Variables"],
            **props(template, name).get("Environment", {}).get("Variables", {})}


def test_secrets_are_readable_only_by_name(template):
    expected = {
        "ChatFunction": [APP_SECRET, PROVIDER_SECRET],
        "ChatStreamFunction": [APP_SECRET, PROVIDER_SECRET],
        "ExtractFunction": [APP_SECRET, PROVIDER_SECRET],
        "SweeperFunction": [APP_SECRET],
        "MigrateFunction": [ADMIN_SECRET, APP_SECRET],
    }
    for name, secrets in expected.items():
        granted = [r for s in statements(template, name) if s["Action"] == "secretsmanager:GetSecretValue"
                   for r in as_list(s["Resource"])]
        assert granted == secrets, name
        env = props(template, name).get("Environment", {}).get("Variables", {})
        # A function is told about the provider secret only if it may read it.
        assert ("PROVIDER_SECRET_ARN" in env) == (PROVIDER_SECRET in secrets), name
    assert "PROVIDER_SECRET_ARN" not in template["Globals"]["Function"]["Environment"]["Variables"]


def test_only_the_migration_has_the_admin_database_secret(template):
    """The app functions log in as the DML-only app user; the migration keeps the DDL-capable admin login."""
    for name in ("ChatFunction", "ChatStreamFunction", "SweeperFunction", "ExtractFunction"):
        env = environment(template, name)
        assert env["DATABASE_SECRET_ARN"] == APP_SECRET, name
        assert "APP_DATABASE_SECRET_ARN" not in env, name
        assert ADMIN_SECRET not in [r for s in statements(template, name) for r in as_list(s["Resource"])], name
        assert {a for s in statements(template, name) if any(a.startswith("secretsmanager:")
                                                             for a in as_list(s["Action"]))
                for a in as_list(s["Action"])} == {"secretsmanager:GetSecretValue"}, name
    env = environment(template, "MigrateFunction")
    assert (env["DATABASE_SECRET_ARN"], env["APP_DATABASE_SECRET_ARN"]) == (ADMIN_SECRET, APP_SECRET)
    # The migration writes the app secret's host/port/dbname, and nothing else.
    writes = [s for s in statements(template, "MigrateFunction") if s["Action"] != "secretsmanager:GetSecretValue"]
    assert [(s["Action"], s["Resource"]) for s in writes] == [("secretsmanager:PutSecretValue", APP_SECRET)]


def test_the_app_database_secret_is_generated_with_the_app_username(template):
    secret = resource(template, "AppDatabaseSecret")
    assert secret["Type"] == "AWS::SecretsManager::Secret"
    generate = secret["Properties"]["GenerateSecretString"]
    assert generate["GenerateStringKey"] == "password" and generate["PasswordLength"] >= 32
    assert generate["ExcludePunctuation"] is True  # no quoting surprises in a conninfo or a SQL literal
    assert generate["SecretStringTemplate"] == {"Fn::Sub": '{"username": "${AppDatabaseUsername}"}'}
    username = template["Parameters"]["AppDatabaseUsername"]
    import re

    pattern = re.compile(username["AllowedPattern"])
    assert pattern.match(username["Default"])
    assert not any(pattern.match(bad) for bad in ("postgres", "eros_app", "rdsadmin", "pg_read_all_data",
                                                  "Robert'); --", ""))
    # A new app secret (or username) re-runs the migration, which creates that user.
    assert props(template, "DatabaseMigration")["AppDatabaseSecret"] == APP_SECRET
    assert template["Outputs"]["AppDatabaseSecretArn"]["Value"] == APP_SECRET


def test_every_function_verifies_the_database_certificate_with_a_configurable_bundle(template):
    env = template["Globals"]["Function"]["Environment"]["Variables"]
    assert template["Parameters"]["DatabaseSslRootCert"]["Default"] == ""
    bundle = env["DATABASE_SSL_ROOT_CERT"]
    for name in FUNCTIONS:
        assert environment(template, name)["DATABASE_SSL_ROOT_CERT"] == bundle, name
    # RDS Proxy's certificate chains to the Amazon roots (the default); Aurora's own to the RDS CA ("rds").
    assert resolved(template, bundle, Profile="production") == ""
    assert resolved(template, bundle, Profile="starter") == "rds"
    assert resolved(template, bundle, Profile="starter", CreateDatabase="false") == ""
    for profile in ("starter", "production"):
        assert resolved(template, bundle, Profile=profile, DatabaseSslRootCert="system") == {
            "Ref": "DatabaseSslRootCert"}


def test_the_sweeper_may_only_invoke_the_extract_function_and_publish_to_the_memory_bus(template):
    sweeper = statements(template, "SweeperFunction")
    lambda_statements = [s for s in sweeper if any(a.startswith("lambda:") for a in as_list(s["Action"]))]
    assert len(lambda_statements) == 1
    assert as_list(lambda_statements[0]["Action"]) == ["lambda:InvokeFunction"]
    assert as_list(lambda_statements[0]["Resource"]) == [{"Fn::GetAtt": ["ExtractFunction", "Arn"]}]
    actions = {a for s in sweeper for a in as_list(s["Action"])}
    assert actions == {"lambda:InvokeFunction", "secretsmanager:GetSecretValue", "events:PutEvents"}
    [publish] = [s for s in sweeper if "events:PutEvents" in as_list(s["Action"])]
    assert as_list(publish["Resource"]) == [{"Fn::GetAtt": ["MemoryEventBus", "Arn"]}]  # its own bus, no other
    assert props(template, "SweeperFunction")["Environment"]["Variables"]["EVENT_BUS_NAME"] == {"Ref": "MemoryEventBus"}
    assert props(template, "SweeperFunction")["Environment"]["Variables"]["EXTRACT_FUNCTION_NAME"] == \
        {"Ref": "ExtractFunction"}
    for name in ("ChatFunction", "ExtractFunction", "MigrateFunction"):
        assert not any(a.startswith("lambda:") for s in statements(template, name) for a in as_list(s["Action"]))


@pytest.fixture(scope="module")
def transformed(template) -> dict:
    """The CloudFormation SAM generates from the template (no AWS call: no managed policy is looked up)."""
    import os

    from samtranslator.translator.transform import transform  # comes with aws-sam-cli

    sam = copy.deepcopy(template)
    for r in sam["Resources"].values():
        for key in ("CodeUri", "ContentUri"):
            if key in r.get("Properties", {}):
                r["Properties"][key] = "s3://bucket/artifact.zip"

    class NoManagedPolicyLookups:
        def load(self):
            raise AssertionError("the template names a managed policy")

    region = os.environ.get("AWS_DEFAULT_REGION")
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    try:
        return transform(sam, {}, NoManagedPolicyLookups())
    finally:
        if region is None:
            os.environ.pop("AWS_DEFAULT_REGION")
        else:
            os.environ["AWS_DEFAULT_REGION"] = region


def test_the_transformed_template_grants_nothing_more(transformed):
    """What SAM generates: inline policies without wildcards, and only the managed policies SAM adds."""
    cfn = transformed
    roles = {n: r["Properties"] for n, r in cfn["Resources"].items() if r["Type"] == "AWS::IAM::Role"}
    assert {f"{f}Role" for f in FUNCTIONS} <= set(roles)
    for name, role in roles.items():
        assert set(role.get("ManagedPolicyArns", [])) <= SAM_MANAGED_POLICIES, name
        for policy in role.get("Policies", []):
            for statement in policy["PolicyDocument"]["Statement"]:
                assert all("*" not in a for a in as_list(statement["Action"])), (name, statement)
                assert statement["Resource"] == EXPORT_OBJECTS or "*" not in json.dumps(statement["Resource"]), (
                    name, statement)
    invoke = [(s["Action"], s["Resource"]) for p in roles["SweeperFunctionRole"]["Policies"]
              for s in p["PolicyDocument"]["Statement"] if "lambda:InvokeFunction" in as_list(s["Action"])]
    assert invoke == [("lambda:InvokeFunction", {"Fn::GetAtt": ["ExtractFunction", "Arn"]})]


def test_the_api_calls_the_chat_alias_whose_cold_start_mode_is_a_parameter(template, transformed):
    """SnapStart and provisioned concurrency work on published versions only: the HTTP API must call the
    alias SAM publishes, never $LATEST; ChatColdStart picks the mode (SnapStart by default)."""
    parameter = template["Parameters"]["ChatColdStart"]
    assert parameter["Default"] == "snapstart" and set(parameter["AllowedValues"]) == {"snapstart", "provisioned",
                                                                                        "on-demand"}
    resources = transformed["Resources"]
    alias = resources["ChatFunctionAliaslive"]
    assert alias["Type"] == "AWS::Lambda::Alias" and alias["Properties"]["Name"] == "live"
    assert alias["Properties"]["ProvisionedConcurrencyConfig"]["Fn::If"][0] == "ChatProvisioned"
    assert resources["ChatFunction"]["Properties"]["SnapStart"] == {
        "ApplyOn": {"Fn::If": ["ChatSnapStart", "PublishedVersions", "None"]}}
    integrations = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::Permission"
                    and "ChatFunction" in json.dumps(r["Properties"]["FunctionName"])]
    assert integrations and all(p["FunctionName"] == {"Ref": "ChatFunctionAliaslive"} for p in integrations)
    api = json.dumps(resources["ChatApi"]["Properties"]["Body"])
    assert "ChatFunctionAliaslive" in api and '"ChatFunction.Arn"' not in api


# --- the streaming front door (issue 31; docs/DEPLOY.md, "Streaming front door") -------------------------------
def test_streamed_turns_are_a_function_url_that_streams_through_our_own_runtime_loop(template):
    """The Python managed runtime does not stream: the stream function keeps it and replaces its loop through
    AWS_LAMBDA_EXEC_WRAPPER (functions/chat/stream-bootstrap runs eros.stream_runtime), behind a function URL in
    RESPONSE_STREAM mode. The same code, layer, network, database login and turn budget as the chat function."""
    import os

    stream, chat = props(template, "ChatStreamFunction"), props(template, "ChatFunction")
    assert (stream["CodeUri"], stream["Handler"]) == (chat["CodeUri"], "stream.lambda_handler")
    assert stream["FunctionUrlConfig"]["AuthType"] == "NONE"  # the function verifies the token (eros.auth)
    assert stream["FunctionUrlConfig"]["InvokeMode"] == "RESPONSE_STREAM"
    wrapper = environment(template, "ChatStreamFunction")["AWS_LAMBDA_EXEC_WRAPPER"]
    assert wrapper.startswith("/var/task/")  # Lambda unpacks the function's code there
    script = ROOT / stream["CodeUri"] / wrapper.removeprefix("/var/task/")
    assert script.is_file() and os.access(script, os.X_OK)
    assert "python3 -m eros.stream_runtime" in script.read_text()
    # SnapStart is not verified with an exec wrapper that replaces the runtime loop: none, nor the alias for it.
    assert not {"SnapStart", "AutoPublishAlias", "ProvisionedConcurrencyConfig"} & set(stream)
    assert (stream["MemorySize"], stream["Timeout"]) == (chat["MemorySize"], chat["Timeout"])
    variables = stream["Environment"]["Variables"]
    assert variables["TURN_BUDGET_SECS"] == chat["Environment"]["Variables"]["TURN_BUDGET_SECS"]
    assert "EXPORT_BUCKET" not in variables  # turns only: no export objects to reach
    assert props(template, "ChatStreamLogGroup")["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    assert template["Outputs"]["StreamUrl"]["Value"] == {"Fn::GetAtt": ["ChatStreamFunctionUrl", "FunctionUrl"]}


def test_the_stream_function_accepts_exactly_the_tokens_the_http_api_accepts(template):
    from eros.auth import audiences

    jwt = props(template, "ChatApi")["Auth"]["Authorizers"]["JwtAuthorizer"]["JwtConfiguration"]
    variables = props(template, "ChatStreamFunction")["Environment"]["Variables"]
    own = {}
    theirs = {"JwtIssuer": "https://issuer.example.com/", "JwtAudience": "app-1,app-2"}
    for given in (own, theirs):
        assert resolved(template, variables["JWT_ISSUER"], **given) == resolved(template, jwt["issuer"], **given)
    assert resolved(template, variables["JWT_AUDIENCE"]) == {"Ref": "UserPoolClient"}
    assert resolved(template, jwt["audience"]) == [{"Ref": "UserPoolClient"}]
    # CloudFormation joins the list parameter into the comma list eros.auth splits again.
    assert resolved(template, variables["JWT_AUDIENCE"], **theirs) == {"Fn::Join": [",", {"Ref": "JwtAudience"}]}
    assert resolved(template, jwt["audience"], **theirs) == {"Ref": "JwtAudience"}
    settings = Settings.from_env({"JWT_ISSUER": theirs["JwtIssuer"], "JWT_AUDIENCE": theirs["JwtAudience"]})
    assert "jwt_issuer" in settings.model_fields_set and audiences(settings.jwt_audience) == {"app-1", "app-2"}
    # The chat function's environment never sets JWT_ISSUER: the HTTP API verified its tokens.
    assert "JWT_ISSUER" not in environment(template, "ChatFunction")


def test_the_stream_function_is_bounded_by_its_reserved_concurrency_and_watched_like_the_api(template):
    params = template["Parameters"]
    assert params["ChatStreamReservedConcurrency"]["Default"] > 0 and params["ChatStreamReservedConcurrency"][
        "MinValue"] == 0
    assert props(template, "ChatStreamFunction")["ReservedConcurrentExecutions"] == {
        "Fn::If": ["ReserveChatStreamConcurrency", {"Ref": "ChatStreamReservedConcurrency"}, {"Ref": "AWS::NoValue"}]}
    assert template["Conditions"]["ReserveChatStreamConcurrency"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "ChatStreamReservedConcurrency"}, 0]}]}
    stream = {"Ref": "ChatStreamFunction"}

    def watched(alarm: str) -> dict[str, str]:
        return {m["Id"]: m["MetricStat"]["Metric"]["MetricName"] for m in props(template, alarm)["Metrics"]
                if "MetricStat" in m and m["MetricStat"]["Metric"]["Dimensions"][0]["Value"] == stream}

    assert watched("ChatStream5xxAlarm") == {"url5xx": "Url5xxCount", "errors": "Errors"}
    assert props(template, "ChatStream5xxAlarm")["Threshold"] == props(template, "Chat5xxAlarm")["Threshold"]
    assert watched("ThrottlesAlarm") == {"stream": "Throttles"}
    assert "stream" in props(template, "ThrottlesAlarm")["Metrics"][0]["Expression"].split()
    duration = props(template, "ChatStreamDurationAlarm")
    assert (duration["MetricName"], duration["Dimensions"]) == ("Duration", [{"Name": "FunctionName", "Value": stream}])
    assert duration["Threshold"] == props(template, "ChatLatencyAlarm")["Threshold"]
    # CORS as the HTTP API's: off unless CorsAllowOrigins names origins, then the same origins and headers.
    cors, api = props(template, "ChatStreamFunction")["FunctionUrlConfig"]["Cors"], props(template, "ChatApi")
    assert resolved(template, {"Cors": cors}) == {}
    origins = {"CorsAllowOrigins": "https://console.example.com"}
    on, api_on = resolved(template, cors, **origins), resolved(template, api["CorsConfiguration"], **origins)
    assert (on["AllowOrigins"], on["AllowHeaders"], on["AllowMethods"]) == (
        api_on["AllowOrigins"], api_on["AllowHeaders"], ["POST"])


def test_the_transformed_stream_function_has_a_streaming_url_anyone_may_call(transformed):
    resources = transformed["Resources"]
    url = resources["ChatStreamFunctionUrl"]
    assert url["Type"] == "AWS::Lambda::Url"
    assert url["Properties"]["TargetFunctionArn"] == {"Ref": "ChatStreamFunction"}
    assert (url["Properties"]["AuthType"], url["Properties"]["InvokeMode"]) == ("NONE", "RESPONSE_STREAM")
    granted = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::Permission"
               and r["Properties"]["FunctionName"] == {"Ref": "ChatStreamFunction"}]
    # The URL's permission, and (what AWS asks of new function URLs) lambda:InvokeFunction through the URL only.
    assert {(p["Action"], p.get("FunctionUrlAuthType"), p.get("InvokedViaFunctionUrl")) for p in granted} == {
        ("lambda:InvokeFunctionUrl", "NONE", None), ("lambda:InvokeFunction", None, True)}
    assert all(p["Principal"] == "*" for p in granted)


# --- dreaming ---------------------------------------------------------------------------------
def test_the_sweeper_runs_on_the_schedule_parameter(template):
    events = props(template, "SweeperFunction")["Events"]
    assert [e["Type"] for e in events.values()] == ["ScheduleV2"]
    schedule = next(iter(events.values()))["Properties"]
    rate = schedule["ScheduleExpression"]
    assert template["Parameters"]["DreamingScheduleRate"]["Default"] == ""  # the profile's
    assert resolved(template, rate, Profile="production") == "rate(5 minutes)"
    assert Settings().dreaming_tick_secs == 300  # the local stack's, as production's
    # Each sweep resumes a paused database: every 5 minutes, the starter's Aurora would never pause.
    assert resolved(template, rate, Profile="starter") == "rate(1 hour)"
    for profile in ("starter", "production"):
        assert resolved(template, rate, Profile=profile, DreamingScheduleRate="rate(2 hours)") == {
            "Ref": "DreamingScheduleRate"}
    # The backlog alarm treats a period without a sweep as breaching: a period holds a sweep in each profile.
    period = props(template, "DreamingBacklogAlarm")["Period"]
    assert (resolved(template, period, Profile="production"), resolved(template, period, Profile="starter")) == (
        900, 3600)
    # The schedule's payload has the keys of the sample event.
    sample = json.loads((ROOT / "events/sweeper_schedule.json").read_text())
    assert set(json.loads(schedule["Input"])) <= set(sample)
    assert props(template, "SweeperFunction")["Timeout"] < 300  # done before the next sweep


def test_extract_finishes_before_its_claim_can_go_stale(template):
    extract = props(template, "ExtractFunction")
    stale = template["Parameters"]["DreamingClaimStaleSecs"]
    assert stale["Default"] == Settings().dreaming_claim_stale_secs == 600
    assert extract["Timeout"] < stale["Default"] and extract["Timeout"] < stale["MinValue"]
    # The last attempt starts within MaximumEventAgeInSeconds of the claim and runs at most Timeout.
    assert extract["Timeout"] + extract["EventInvokeConfig"]["MaximumEventAgeInSeconds"] < stale["MinValue"]
    reserved = extract["ReservedConcurrentExecutions"]
    assert reserved == {"Fn::If": ["ReserveExtractConcurrency", {"Ref": "ExtractReservedConcurrency"},
                                   {"Ref": "AWS::NoValue"}]}


def test_failed_extractions_land_in_the_encrypted_dead_letter_queue(template):
    config = props(template, "ExtractFunction")["EventInvokeConfig"]
    assert config["MaximumRetryAttempts"] == 2
    assert config["DestinationConfig"]["OnFailure"] == {
        "Type": "SQS", "Destination": {"Fn::GetAtt": ["ExtractDeadLetterQueue", "Arn"]}}
    queue = resource(template, "ExtractDeadLetterQueue")
    assert queue["Type"] == "AWS::SQS::Queue"
    assert queue["Properties"].get("SqsManagedSseEnabled") is True or \
        queue["Properties"].get("KmsMasterKeyId") == "alias/aws/sqs"


def test_parameter_defaults_are_the_codes_defaults(template):
    params, defaults = template["Parameters"], Settings()
    assert params["ChatModel"]["Default"] == defaults.chat_model
    # Empty: EXTRACT_MODEL is then unset, and the code's default is the chat model (a ChatModel set alone moves both).
    assert params["ExtractModel"]["Default"] == "" and defaults.extract_model == defaults.chat_model
    unset = params["ExtractModel"]["Default"]
    assert Settings.from_env({"CHAT_MODEL": "m", "EXTRACT_MODEL": unset}).extract_model == "m"
    assert params["EmbedModel"]["Default"] == defaults.embed_model
    assert params["DreamingIdleSecs"]["Default"] == defaults.dreaming_idle_secs == 1800
    assert params["DreamingBatchSize"]["Default"] == defaults.dreaming_batch_size
    assert params["DreamingTickCap"]["Default"] == defaults.dreaming_tick_cap
    assert params["DreamingMaxAttempts"]["Default"] == defaults.dreaming_max_attempts
    # Plain lists: an AWS-typed list cannot be empty, and CreateDatabase=true leaves them so.
    assert params["SubnetIds"]["Type"] == params["SecurityGroupIds"]["Type"] == "CommaDelimitedList"


# --- environment ------------------------------------------------------------------------------
def test_every_environment_variable_is_read_by_the_code(template):
    fields = Settings.env_names()
    names = set(template["Globals"]["Function"]["Environment"]["Variables"])
    for name in FUNCTIONS:
        names |= set(props(template, name).get("Environment", {}).get("Variables", {}))
    # AWS_LAMBDA_EXEC_WRAPPER is Lambda's own: what the stream function's runtime runs instead of its bootstrap.
    lambdas = {"AWS_LAMBDA_EXEC_WRAPPER"}
    unknown = {n for n in names if n not in fields and not n.startswith("POWERTOOLS_") and n not in lambdas}
    assert not unknown, f"set in template.yaml but read by nothing: {sorted(unknown)}"
    assert {"DATABASE_SECRET_ARN", "DATABASE_HOST", "PROVIDER_SECRET_ARN", "EXTRACT_FUNCTION_NAME"} <= names
    # Secrets come from Secrets Manager in AWS, never from plain variables. DATABASE_URL is declared, empty,
    # only so that `sam local invoke --env-vars` can set it (SAM overrides declared variables alone).
    assert not names & {"OPENROUTER_API_KEY", "VOYAGE_API_KEY"}
    assert template["Globals"]["Function"]["Environment"]["Variables"]["DATABASE_URL"] == ""
    assert all("DATABASE_URL" not in props(template, name).get("Environment", {}).get("Variables", {})
               for name in FUNCTIONS)


def test_parameter_backed_variables_parse_as_settings(template):
    """The parameter defaults, as strings in the environment, validate as Settings."""
    params = template["Parameters"]
    env = {}
    for key, value in template["Globals"]["Function"]["Environment"]["Variables"].items():
        if isinstance(value, dict) and "Ref" in value and "Default" in params.get(value["Ref"], {}):
            env[key] = str(params[value["Ref"]]["Default"])
        elif isinstance(value, (str, int, float)):
            env[key] = str(value)
    settings = Settings.from_env(env)
    assert settings.dreaming_claim_stale_secs == 600 and settings.database_host is None  # "" = the secret's host


# --- deploy-time migration ----------------------------------------------------------------------
def test_the_migration_custom_resource_reruns_when_the_package_changes(template):
    migration = resource(template, "DatabaseMigration")
    assert migration["Type"] == "Custom::DatabaseMigration"
    assert migration["Properties"]["ServiceToken"] == {"Fn::GetAtt": ["MigrateFunction", "Arn"]}
    assert migration["Properties"]["MigrationsVersion"] == {"Ref": "ErosLayer"}
    for name in ("ChatFunction", "ChatStreamFunction", "SweeperFunction", "ExtractFunction"):
        assert resource(template, name).get("DependsOn") in ("DatabaseMigration", ["DatabaseMigration"]), name
    assert props(template, "MigrateFunction")["Timeout"] >= 120


# --- sample events ------------------------------------------------------------------------------
def _event(name: str) -> dict:
    return json.loads((ROOT / "events" / f"{name}.json").read_text())


@pytest.mark.parametrize("name, method, path, authorized", [
    ("chat_health", "GET", "/v1/health", False),
    ("chat_personas", "GET", "/v1/personas", True),
    ("chat_turn", "POST", "/v1/sessions/", True),
])
def test_http_api_sample_events_have_the_v2_shape(name, method, path, authorized):
    event = _event(name)
    assert event["version"] == "2.0" and event["isBase64Encoded"] is False
    http = event["requestContext"]["http"]
    assert http["method"] == method and event["rawPath"] == http["path"] and http["path"].startswith(path)
    assert event["requestContext"]["stage"] == "$default"
    assert event["routeKey"] == event["requestContext"]["routeKey"]
    assert ((http["method"], http["path"]) in PUBLIC_ROUTES) == (not authorized)
    if authorized:
        assert event["requestContext"]["authorizer"]["jwt"]["claims"]["sub"]
        assert event["headers"]["authorization"].startswith("Bearer ")
    else:
        assert "authorizer" not in event["requestContext"]


def test_the_stream_sample_is_a_function_url_event_of_the_stream_route():
    """What a function URL (AuthType NONE) sends: payload 2.0, no authorizer (the function checks the token), the
    same body as the JSON turn's."""
    from eros_dev.server import STREAM_ROUTE

    event, turn = _event("chat_stream_turn"), _event("chat_turn")
    context = event["requestContext"]
    assert (event["version"], event["routeKey"], context["routeKey"], context["stage"]) == (
        "2.0", "$default", "$default", "$default")
    assert context["domainName"] == f"{context['domainPrefix']}.lambda-url.us-east-1.on.aws" == event["headers"]["host"]
    assert context["http"]["method"] == "POST" and STREAM_ROUTE.match(event["rawPath"])
    assert event["rawPath"] == context["http"]["path"] == turn["rawPath"] + "/stream"
    assert "authorizer" not in context and event["headers"]["authorization"].startswith("Bearer ")
    assert set(json.loads(event["body"])) == set(json.loads(turn["body"]))
    assert int(event["headers"]["content-length"]) == len(event["body"].encode())


def test_the_chat_turn_sample_posts_json_to_a_session():
    from uuid import UUID

    event = _event("chat_turn")
    _, v1, sessions, session_id, turns = event["rawPath"].split("/")
    assert (v1, sessions, turns) == ("v1", "sessions", "turns") and UUID(session_id)
    body = json.loads(event["body"])
    assert body["content"] and "user_id" not in body


def test_the_extract_sample_is_what_the_sweeper_sends():
    from datetime import datetime
    from uuid import UUID

    from eros.dreaming.session import event as extract_payload

    event = _event("extract_session")
    sent = extract_payload({"id": UUID(event["session_id"]), "user_id": event["user_id"],
                            "instance_id": UUID("0b9e8d7c-6a5f-4e3d-9c2b-1a0f9e8d7c6b"),
                            "claim_token": datetime.fromisoformat(event["claim_token"])})
    assert sent == event


def test_the_migration_sample_is_a_custom_resource_create():
    event = _event("migrate_create")
    assert event["RequestType"] == "Create" and event["ResourceType"] == "Custom::DatabaseMigration"
    assert event["ResponseURL"].startswith("https://")
    assert {"StackId", "RequestId", "LogicalResourceId", "ResourceProperties"} <= set(event)
    assert {"ServiceToken", "MigrationsVersion"} <= set(event["ResourceProperties"])


# --- spend (issue 8 item 10) ----------------------------------------------------------------------
def test_the_http_api_is_throttled_by_parameters(template):
    routes = props(template, "ChatApi")["DefaultRouteSettings"]
    assert routes == {"ThrottlingRateLimit": {"Ref": "ApiThrottlingRateLimit"},
                      "ThrottlingBurstLimit": {"Ref": "ApiThrottlingBurstLimit"}}
    params = template["Parameters"]
    rate, burst = params["ApiThrottlingRateLimit"], params["ApiThrottlingBurstLimit"]
    assert rate["MinValue"] >= 1 and burst["MinValue"] >= 1  # 0 would refuse every request
    assert 1 <= rate["Default"] <= burst["Default"] <= 5000  # below the account's default quota


def test_the_chat_function_has_a_concurrency_cap_parameter(template):
    params = template["Parameters"]
    assert params["ChatReservedConcurrency"]["Default"] > 0
    assert props(template, "ChatFunction")["ReservedConcurrentExecutions"] == {
        "Fn::If": ["ReserveChatConcurrency", {"Ref": "ChatReservedConcurrency"}, {"Ref": "AWS::NoValue"}]}
    assert template["Conditions"]["ReserveChatConcurrency"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "ChatReservedConcurrency"}, 0]}]}


def test_per_user_limits_are_on_in_aws_and_reach_every_function(template):
    params, variables = template["Parameters"], template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["TURNS_PER_MINUTE"] == {"Ref": "TurnsPerMinute"}
    assert variables["DAILY_TOKEN_BUDGET"] == {"Ref": "DailyTokenBudget"}
    # Off in the code's defaults (local runs), on in a deployment.
    assert Settings().turns_per_minute == 0 and Settings().daily_token_budget == 0
    env = {"TURNS_PER_MINUTE": str(params["TurnsPerMinute"]["Default"]),
           "DAILY_TOKEN_BUDGET": str(params["DailyTokenBudget"]["Default"])}
    parsed = Settings.from_env(env)
    assert parsed.turns_per_minute > 0 and parsed.daily_token_budget > 0


# --- operating it (issue 13, part 2) -------------------------------------------------------------------------
def emitted_metrics() -> set[str]:
    """Every metric name the code can emit: the constant names of ``add_metric`` calls, and where the name is
    a variable, the constants it takes (a loop over (name, value) pairs, or a module-level dict's values)."""
    import ast

    names: set[str] = set()
    for path in [*(ROOT / "layers" / "eros" / "eros").rglob("*.py"), *(ROOT / "functions").rglob("app.py")]:
        tree = ast.parse(path.read_text())
        tables = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                  for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Dict)}
        loops = {node.target.elts[0].id: node.iter for node in ast.walk(tree)
                 if isinstance(node, ast.For) and isinstance(node.target, ast.Tuple)
                 and isinstance(node.target.elts[0], ast.Name)}
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "add_metric"):
                continue
            [name] = [k.value for k in call.keywords if k.arg == "name"]
            if isinstance(name, ast.Name) and name.id in loops:
                name = loops[name.id]
            if isinstance(name, ast.Subscript) and isinstance(name.value, ast.Name):
                name = tables[name.value.id]
            names |= {n.value for n in ast.walk(name) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                      and n.value[:1].isupper()}
    return names


def alarms(template: dict) -> dict[str, dict]:
    return {name: r["Properties"] for name, r in template["Resources"].items() if r["Type"] == "AWS::CloudWatch::Alarm"}


def eros_metrics_of_alarm(alarm: dict) -> set[str]:
    if alarm.get("Namespace") == "Eros":
        return {alarm["MetricName"]}
    return {m["MetricStat"]["Metric"]["MetricName"] for m in alarm.get("Metrics", [])
            if "MetricStat" in m and m["MetricStat"]["Metric"]["Namespace"] == "Eros"}


def dashboard_metrics(template: dict) -> set[str]:
    """The Eros metrics the dashboard's widgets name (a row's "." repeats the namespace of the row before)."""
    body = json.loads(props(template, "Dashboard")["DashboardBody"]["Fn::Sub"][0])
    names = set()
    for widget in body["widgets"]:
        namespace = None
        for row in widget["properties"]["metrics"]:
            namespace = row[0] if row[0] not in (".", "...") else namespace
            if namespace == "Eros" and row[0] != "...":
                names.add(row[1])
    return names


def test_the_code_emits_every_metric_the_alarms_and_the_dashboard_read(template):
    emitted = emitted_metrics()
    assert {"Turns", "ExtractGaveUp", "MemoriesExtracted", "DreamingBacklogAge", "ProviderTokens"} <= emitted
    read = set().union(*(eros_metrics_of_alarm(a) for a in alarms(template).values())) | dashboard_metrics(template)
    assert {"ExtractGaveUp", "ExtractInvoked", "ExtractRetriesScheduled", "DreamingBacklogAge",
            "ProviderTokens", "Turns", "RecallRows", "MemoriesSuperseded"} <= read
    assert read <= emitted, f"read by an alarm or the dashboard, emitted by nothing: {sorted(read - emitted)}"


def test_every_alarm_notifies_the_topic_when_it_fires_and_when_it_clears(template):
    found = alarms(template)
    assert {"ExtractDeadLettersAlarm", "SessionsGivenUpAlarm", "ExtractFailureRateAlarm", "Chat5xxAlarm",
            "ChatLatencyAlarm", "ThrottlesAlarm", "ProxyConnectionsAlarm", "DreamingBacklogAlarm",
            "SpendAlarm", "ChatStream5xxAlarm", "ChatStreamDurationAlarm"} <= set(found)
    for name, alarm in found.items():
        recover = [{"Fn::Sub": "arn:${AWS::Partition}:automate:${AWS::Region}:ec2:recover"}]
        actions = alarm["AlarmActions"][1:] if alarm["AlarmActions"][:1] == recover else alarm["AlarmActions"]
        assert actions == alarm["OKActions"] == [{"Ref": "AlarmTopic"}], name
        threshold = alarm["Threshold"]
        assert threshold == 1 or (isinstance(threshold, dict) and threshold["Ref"] in template["Parameters"]), name
    for name, spec in template["Parameters"].items():
        if name.startswith("Alarm") and spec["Type"] == "Number":
            assert spec.get("MinValue", 0) >= 1, name  # a threshold of 0 would fire for ever
    assert resource(template, "AlarmSubscription")["Condition"] == "AlarmMail"
    assert resource(template, "ProxyConnectionsAlarm")["Condition"] == "ProxyWatched"


def test_logs_are_kept_for_the_retention_parameter_and_the_api_logs_access(template):
    groups = {name for name, r in template["Resources"].items() if r["Type"] == "AWS::Logs::LogGroup"}
    for name in groups:
        assert props(template, name)["RetentionInDays"] == {"Ref": "LogRetentionDays"}, name
    for name in FUNCTIONS:
        group = props(template, name)["LoggingConfig"]["LogGroup"]["Ref"]
        assert group in groups, name
    access = props(template, "ChatApi")["AccessLogSettings"]
    assert access["DestinationArn"] == {"Fn::GetAtt": ["ApiAccessLogGroup", "Arn"]}
    logged = json.loads(access["Format"])
    assert {"requestId", "status", "latencyMs", "route"} <= set(logged)
    assert not any("querystring" in v.lower() or "body" in v.lower() for v in logged.values())
    assert 1 <= template["Parameters"]["LogRetentionDays"]["Default"] <= 400


def test_cors_is_a_parameter_and_off_by_default(template):
    assert template["Parameters"]["CorsAllowOrigins"]["Default"] == ""
    cors = props(template, "ChatApi")["CorsConfiguration"]["Fn::If"]
    assert cors[0] == "CorsOn" and cors[2] == {"Ref": "AWS::NoValue"}
    assert cors[1]["AllowOrigins"] == {"Ref": "CorsAllowOrigins"} and "authorization" in cors[1]["AllowHeaders"]


def test_the_migration_never_blocks_a_deploy_or_rollback_for_an_hour(template):
    timeout = props(template, "DatabaseMigration")["ServiceTimeout"]
    migrate = props(template, "MigrateFunction")
    attempts = 1 + migrate["EventInvokeConfig"]["MaximumRetryAttempts"]
    assert migrate["Timeout"] * attempts <= timeout <= 900  # long enough for every attempt, minutes not an hour


# --- one command to a working deployment (issue 13, part 1; the profiles: issue 29) --------------------------
OWN = ("Vpc", "PrivateSubnetA", "PrivateSubnetB", "FunctionSecurityGroup", "DatabaseSecurityGroup", "AuroraCluster",
       "AuroraWriter", "PrivateRoute")
PRODUCTION_ONLY = {"NatGateway", "NatAddress", "ProxySecurityGroup", "DatabaseProxy", "DatabaseProxyTargetGroup",
                   "DatabaseProxyRole", "ProxyConnectionsAlarm"}
STARTER_ONLY = {"NatInstance", "NatSecurityGroup", "NatInstanceRecoveryAlarm", "PausingParameters"}


def test_a_new_stack_makes_its_own_database_network_secrets_and_issuer_by_default(template):
    params = template["Parameters"]
    assert params["CreateDatabase"]["Default"] == "true"
    for name in OWN:
        assert resource(template, name)["Condition"] == "OwnDatabase", name
    # Nothing else must be given: every parameter has a default.
    assert [name for name, spec in params.items() if "Default" not in spec] == []
    assert resource(template, "ProviderSecret")["Condition"] == "OwnProviderSecret"
    assert {resource(template, n)["Condition"] for n in ("UserPool", "UserPoolClient")} == {"OwnUserPool"}
    assert template["Conditions"]["OwnUserPool"] == {"Fn::Equals": [{"Ref": "JwtIssuer"}, ""]}
    # Bring your own: the rule makes a deploy without a database secret fail with a message, not later.
    rule = template["Rules"]["BringYourOwnDatabase"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "CreateDatabase"}, "false"]}
    assert "DatabaseSecretArn" in rule["Assertions"][0]["AssertDescription"]


def test_each_profile_makes_its_own_resources_and_bring_your_own_makes_neither(template):
    assert set(template["Parameters"]["Profile"]["AllowedValues"]) == {"starter", "production"}
    # The default keeps a stack made before the parameter as it was; `make deploy` gives a new stack starter.
    assert template["Parameters"]["Profile"]["Default"] == "production"
    production, starter = created(template, Profile="production"), created(template, Profile="starter")
    assert production >= PRODUCTION_ONLY and not STARTER_ONLY & production
    assert starter >= STARTER_ONLY and not PRODUCTION_ONLY & starter
    assert set(OWN) <= production & starter
    for profile in ("starter", "production"):
        theirs = created(template, Profile=profile, CreateDatabase="false", DatabaseSecretArn="arn:x")
        assert not (set(OWN) | PRODUCTION_ONLY | STARTER_ONLY) & theirs, profile
    assert created(template, Profile="production") == created(template)  # the default profile


def test_aurora_is_serverless_v2_with_pgvector_0_8_a_managed_rotated_secret_and_cheap_idle(template):
    cluster = props(template, "AuroraCluster")
    assert cluster["Engine"] == "aurora-postgresql" and cluster["EngineVersion"] == {"Ref": "AuroraEngineVersion"}
    version = template["Parameters"]["AuroraEngineVersion"]["Default"]
    assert tuple(map(int, version.split("."))) >= (16, 5)  # the first 16.x with pgvector 0.8 (and 0 ACU: 16.3)
    assert cluster["ManageMasterUserPassword"] is True and "MasterUserPassword" not in cluster
    assert cluster["StorageEncrypted"] is True
    scaling = cluster["ServerlessV2ScalingConfiguration"]
    assert resolved(template, scaling, Profile="production") == {
        "MinCapacity": {"Ref": "AuroraMinCapacity"}, "MaxCapacity": {"Ref": "AuroraMaxCapacity"}}
    assert template["Parameters"]["AuroraMinCapacity"]["Default"] == 0.5
    # starter: scales to zero and pauses; the server closes idle sessions, which would keep it from pausing.
    assert resolved(template, scaling, Profile="starter") == {
        "MinCapacity": 0, "MaxCapacity": {"Ref": "AuroraMaxCapacity"},
        "SecondsUntilAutoPause": {"Ref": "AuroraAutoPauseSecs"}}
    pause = template["Parameters"]["AuroraAutoPauseSecs"]
    assert (pause["Default"], pause["MinValue"], pause["MaxValue"]) == (300, 300, 86400)  # what Aurora accepts
    assert resolved(template, cluster["DBClusterParameterGroupName"], Profile="starter") == {
        "Ref": "PausingParameters"}
    assert "DBClusterParameterGroupName" not in resolved(template, cluster, Profile="production")
    group = props(template, "PausingParameters")
    assert int(group["Parameters"]["idle_session_timeout"]) // 1000 < pause["MinValue"]
    assert group["Family"]["Fn::Sub"][0] == "aurora-postgresql${Major}"
    assert resource(template, "AuroraCluster")["DeletionPolicy"] == "Snapshot"  # never lose the memories
    assert props(template, "AuroraWriter")["DBInstanceClass"] == "db.serverless"
    assert props(template, "AuroraWriter")["PubliclyAccessible"] is False


def test_the_functions_reach_only_the_proxy_and_the_proxy_only_aurora(template):
    proxy = props(template, "DatabaseProxy")
    assert proxy["RequireTLS"] is True and proxy["EngineFamily"] == "POSTGRESQL"
    assert [a["SecretArn"] for a in proxy["Auth"]] == [
        {"Fn::GetAtt": ["AuroraCluster", "MasterUserSecret.SecretArn"]}, APP_SECRET]
    [ingress] = props(template, "ProxySecurityGroup")["SecurityGroupIngress"]
    assert (ingress["FromPort"], ingress["SourceSecurityGroupId"]) == (5432, {"Ref": "FunctionSecurityGroup"})
    [ingress] = resolved(template, props(template, "DatabaseSecurityGroup"), Profile="production")[
        "SecurityGroupIngress"]
    assert (ingress["FromPort"], ingress["SourceSecurityGroupId"]) == (5432, {"Ref": "ProxySecurityGroup"})
    assert "SecurityGroupIngress" not in props(template, "FunctionSecurityGroup")
    env = template["Globals"]["Function"]["Environment"]["Variables"]
    migration = props(template, "DatabaseMigration")
    for host in (env["DATABASE_HOST"], migration["DatabaseHost"]):
        assert resolved(template, host, Profile="production") == {"Fn::GetAtt": ["DatabaseProxy", "Endpoint"]}
        assert resolved(template, host, CreateDatabase="false") == {"Ref": "DatabaseProxyEndpoint"}
    # The migration waits for the proxy to have its target and the writer to exist.
    assert resolved(template, migration["DatabaseReady"], Profile="production") == {
        "Fn::Join": [",", [{"Ref": "DatabaseProxyTargetGroup"}, {"Ref": "AuroraWriter"}]]}
    [statement] = props(template, "DatabaseProxyRole")["Policies"][0]["PolicyDocument"]["Statement"]
    assert statement["Action"] == "secretsmanager:GetSecretValue"
    assert statement["Resource"] == [{"Fn::GetAtt": ["AuroraCluster", "MasterUserSecret.SecretArn"]}, APP_SECRET]


def test_the_starter_functions_reach_aurora_itself_and_only_they_do(template):
    [ingress] = resolved(template, props(template, "DatabaseSecurityGroup"), Profile="starter")[
        "SecurityGroupIngress"]
    assert (ingress["FromPort"], ingress["SourceSecurityGroupId"]) == (5432, {"Ref": "FunctionSecurityGroup"})
    env = template["Globals"]["Function"]["Environment"]["Variables"]
    migration = props(template, "DatabaseMigration")
    for host in (env["DATABASE_HOST"], migration["DatabaseHost"]):
        assert resolved(template, host, Profile="starter") == {"Fn::GetAtt": ["AuroraCluster", "Endpoint.Address"]}
    assert resolved(template, migration["DatabaseReady"], Profile="starter") == {"Ref": "AuroraWriter"}
    assert props(template, "AuroraWriter")["PubliclyAccessible"] is False


def test_the_private_subnets_go_out_through_the_profiles_nat(template):
    route = props(template, "PrivateRoute")
    assert resolved(template, route, Profile="production") == {
        "RouteTableId": {"Ref": "PrivateRouteTable"}, "DestinationCidrBlock": "0.0.0.0/0",
        "NatGatewayId": {"Ref": "NatGateway"}}
    assert resolved(template, route, Profile="starter") == {
        "RouteTableId": {"Ref": "PrivateRouteTable"}, "DestinationCidrBlock": "0.0.0.0/0",
        "InstanceId": {"Ref": "NatInstance"}}
    associated = {props(template, n)["SubnetId"]["Ref"] for n, r in template["Resources"].items()
                  if r["Type"] == "AWS::EC2::SubnetRouteTableAssociation"
                  and props(template, n)["RouteTableId"] == {"Ref": "PrivateRouteTable"}}
    assert associated == {"PrivateSubnetA", "PrivateSubnetB"}
    assert props(template, "NatGateway")["SubnetId"] == {"Ref": "PublicSubnetA"}


def test_the_nat_instance_forwards_only_the_functions_https_from_a_public_subnet(template):
    instance = props(template, "NatInstance")
    assert instance["SourceDestCheck"] is False  # else it drops what is not addressed to itself
    assert instance["InstanceType"] == "t4g.nano" and "arm64" in instance["ImageId"]  # the image fits the type
    assert instance["CreditSpecification"] == {"CPUCredits": "standard"}  # throttled, never billed beyond
    [nic] = instance["NetworkInterfaces"]
    assert nic["SubnetId"] == {"Ref": "PublicSubnetA"} and nic["AssociatePublicIpAddress"] is True
    assert nic["GroupSet"] == [{"Ref": "NatSecurityGroup"}]
    assert "KeyName" not in instance and "IamInstanceProfile" not in instance  # nobody logs in, it calls nothing
    script = instance["UserData"]["Fn::Base64"]
    assert "net.ipv4.ip_forward = 1" in script and "MASQUERADE" in script and "systemctl enable --now" in script
    group = props(template, "NatSecurityGroup")
    assert [(r["FromPort"], r["SourceSecurityGroupId"]) for r in group["SecurityGroupIngress"]] == [
        (443, {"Ref": "FunctionSecurityGroup"})]
    assert [(r["FromPort"], r["CidrIp"]) for r in group["SecurityGroupEgress"]] == [(443, "0.0.0.0/0")]
    recovery = props(template, "NatInstanceRecoveryAlarm")
    assert recovery["MetricName"] == "StatusCheckFailed_System"
    assert recovery["Dimensions"] == [{"Name": "InstanceId", "Value": {"Ref": "NatInstance"}}]


def test_the_dashboard_watches_the_proxy_or_the_pausing_aurora(template):
    values = props(template, "Dashboard")["DashboardBody"]["Fn::Sub"][1]
    watched = {profile: {k: resolved(template, values[k], Profile=profile)
                         for k in ("DatabaseDimension", "DatabaseName", "DatabaseLimit")}
               for profile in ("production", "starter")}
    assert watched == {
        "production": {"DatabaseDimension": "ProxyName", "DatabaseName": {"Ref": "DatabaseProxy"},
                       "DatabaseLimit": "MaxDatabaseConnectionsAllowed"},
        "starter": {"DatabaseDimension": "DBClusterIdentifier", "DatabaseName": {"Ref": "AuroraCluster"},
                    "DatabaseLimit": "ServerlessDatabaseCapacity"}}


def test_a_password_flow_for_a_terminal_is_a_parameter_and_off_by_default(template):
    assert template["Parameters"]["AllowPasswordAuth"]["Default"] == "false"
    flows = props(template, "UserPoolClient")["ExplicitAuthFlows"]
    assert resolved(template, flows) == ["ALLOW_USER_SRP_AUTH", "ALLOW_REFRESH_TOKEN_AUTH"]
    assert resolved(template, flows, AllowPasswordAuth="true") == [
        "ALLOW_USER_SRP_AUTH", "ALLOW_USER_PASSWORD_AUTH", "ALLOW_REFRESH_TOKEN_AUTH"]
    assert not conditions(template, AllowPasswordAuth="true", JwtIssuer="https://issuer")["PasswordAuth"]


def test_a_deploy_ends_with_what_to_use(template):
    outputs = template["Outputs"]
    for name in ("ApiUrl", "JwtIssuerUrl", "ProviderSecretArnOut", "ChatFunctionName", "SweeperFunctionName",
                 "ExtractFunctionName", "ExtractDeadLetterQueueUrl", "ExtractDeadLetterQueueArn"):
        assert "Condition" not in outputs[name], name
    assert outputs["UserPoolId"] == {"Condition": "OwnUserPool", "Description": outputs["UserPoolId"]["Description"],
                                     "Value": {"Ref": "UserPool"}}
    assert outputs["UserPoolClientId"]["Condition"] == "OwnUserPool"
    assert outputs["DatabaseProxyEndpointOut"]["Condition"] == "OwnProxy"
    # An output's condition names resources that exist whenever it does.
    for profile in ("starter", "production"):
        decided, made = conditions(template, Profile=profile), created(template, Profile=profile)
        for name, output in outputs.items():
            if decided.get(output.get("Condition", ""), True):
                named = set(re.findall(r"'(?:Ref|Fn::GetAtt)': \[?'(\w+)'", str(resolved(template, output["Value"],
                                                                                           Profile=profile))))
                named = {SAM_GENERATED.get(n, n) for n in named}
                assert named - {"AWS"} <= made, (profile, name)


def test_every_output_the_deploy_guide_names_exists():
    """Outputs the guide reads (``$(out Name)``, its shell helper) or lists in its table of outputs."""
    guide = (ROOT / "docs/DEPLOY.md").read_text()
    named = set(re.findall(r"\$\(out (\w+)\)", guide))
    table = guide[guide.index("| output | what for |"):]
    table = table[:table.index("\n\n")]
    named |= {name for line in table.splitlines()[2:] for name in re.findall(r"`([A-Z]\w+)`", line.split("|")[1])}
    outputs = set(yaml.load((ROOT / "template.yaml").read_text(), Loader=CfnLoader)["Outputs"])
    assert {"UserPoolId", "UserPoolClientId", "ApiUrl", "ExtractFunctionName", "ExtractDeadLetterQueueUrl"} <= named
    assert named <= outputs, f"docs/DEPLOY.md names outputs the template lacks: {sorted(named - outputs)}"
