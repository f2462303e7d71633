"""The `sam local invoke` recipe for people with Docker (sam-local.toml, sam-local-env.json), checked as
far as a machine without a container engine allows: SAM reads the config and reaches the point where it
needs Docker; every variable of the env file is one the template declares for the function (SAM silently
drops the others) and one the settings read; the placeholders fill every required parameter and pass its
constraint; and the settings a function would get make it use DATABASE_URL and the offline providers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib

import pytest
import yaml
from helpers import EVENTS, ROOT
from test_template import CfnLoader, environment

from eros.config import Settings

pytestmark = pytest.mark.e2e

CONFIG = tomllib.loads((ROOT / "sam-local.toml").read_text())["default"]["local_invoke"]["parameters"]
ENV = json.loads((ROOT / "sam-local-env.json").read_text())["Parameters"]
FUNCTIONS = ("ChatFunction", "SweeperFunction", "ExtractFunction")


def template() -> dict:
    return yaml.load((ROOT / "template.yaml").read_text(), Loader=CfnLoader)


def overrides() -> dict[str, str]:
    return dict(item.split("=", 1) for item in CONFIG["parameter_overrides"])


def test_the_placeholders_fill_what_the_bring_your_own_branch_needs_within_its_constraints():
    parameters = template()["Parameters"]
    assert overrides()["CreateDatabase"] == "false"  # no Aurora, VPC or proxy to pretend
    assert {"DatabaseSecretArn", "ProviderSecretArn", "SubnetIds", "SecurityGroupIds", "JwtIssuer",
            "JwtAudience"} <= set(overrides())
    assert all(overrides()[name] for name in overrides())
    for name, value in overrides().items():
        pattern = parameters[name].get("AllowedPattern")
        assert pattern is None or re.fullmatch(pattern, value), (name, value)


def test_every_variable_of_the_env_file_is_declared_by_the_template_and_read_by_the_settings():
    declared = set().union(*(environment(template(), function) for function in FUNCTIONS))
    assert set(ENV) <= declared, set(ENV) - declared  # SAM drops what no function declares, without a word
    assert set(ENV) - {"POWERTOOLS_LOG_LEVEL"} <= Settings.env_names()


@pytest.mark.parametrize("function", FUNCTIONS)
def test_in_the_container_each_function_uses_database_url_and_the_offline_providers(function):
    declared = environment(template(), function)
    # What the function's settings would be: the template's values, the file's over those it declares
    # (intrinsics resolve to something non-empty; the file empties the secret ARNs).
    values = {k: ("resolved" if isinstance(v, dict) else str(v)) for k, v in declared.items()}
    values |= {k: v for k, v in ENV.items() if k in declared}
    cfg = Settings.from_env({k: v for k, v in values.items() if k in Settings.env_names() and v != "resolved"})
    assert cfg.database_url is not None and cfg.database_secret_arn is None and cfg.provider_secret_arn is None
    assert not cfg.llm_online and not cfg.embed_online  # the offline providers: no key is needed


def test_sam_reads_the_recipe_and_stops_only_for_want_of_docker(tmp_path):
    sam = shutil.which("sam", path=str(ROOT / ".venv" / "bin"))
    assert sam, "aws-sam-cli is in requirements-dev.txt"
    command = [sam, "local", "invoke", "--config-file", "sam-local.toml", "ChatFunction",
               "-e", str(EVENTS / "chat_health.json")]
    # The config is really read: one that names a missing env file fails before that point.
    broken = (ROOT / "sam-local.toml").read_text().replace("sam-local-env.json", "events/missing.json")
    (tmp_path / "broken.toml").write_text(broken)
    # Without AWS credentials, as on a laptop that has none: with the run's dummy ones, SAM asks AWS for the
    # account (unreachable here) and waits out its timeouts, ~7 s, before it reads any further.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") or k == "AWS_DEFAULT_REGION"}
    runs = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for argv in (command, [*command[:3], "--config-file", str(tmp_path / "broken.toml"), *command[5:]])]
    (_, recipe), (_, config) = (run.communicate(timeout=120) for run in runs)  # both at once: ~2 s each
    assert runs[0].returncode != 0 and "requires a container runtime" in recipe, recipe[-1500:]
    assert "events/missing.json" in config and "does not exist" in config, config[-1500:]
