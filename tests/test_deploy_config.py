"""A first deploy asks little (issue 29): samconfig.toml holds the settings of `sam deploy` and a new stack's
few parameters, `make deploy` asks at most five questions (make variables), every other parameter has a
default, and docs/DEPLOY.md files every parameter under when it is needed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from test_template import CfnLoader

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
# What a first deploy asks: the Makefile's variables of `make deploy` and the template parameters they set.
QUESTIONS = {"PROFILE": "Profile", "ALARM_EMAIL": "AlarmEmail", "PASSWORD_AUTH": "AllowPasswordAuth",
             "ARCH": "Architecture"}


@pytest.fixture(scope="module")
def template() -> dict:
    return yaml.load((ROOT / "template.yaml").read_text(), Loader=CfnLoader)


@pytest.fixture(scope="module")
def deploy() -> dict:
    return tomllib.loads((ROOT / "samconfig.toml").read_text())["default"]["deploy"]["parameters"]


def overrides(deploy: dict) -> dict[str, str]:
    pairs = deploy["parameter_overrides"]
    return dict(pair.split("=", 1) for pair in (pairs if isinstance(pairs, list) else pairs.split()))


def test_sam_deploy_needs_no_answer_but_the_account(deploy):
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())
    assert config["default"]["global"]["parameters"]["stack_name"] == "eros"
    assert deploy["capabilities"] == "CAPABILITY_IAM" and deploy["resolve_s3"] is True
    assert deploy["confirm_changeset"] is True  # a replacement is seen before it happens
    # The region is the user's profile's: nothing of this file may pin one.
    assert "region" not in re.sub(r"#.*", "", (ROOT / "samconfig.toml").read_text())


def test_every_parameter_is_defaulted_set_or_asked_and_no_more_than_five_are_asked(template, deploy):
    params = template["Parameters"]
    given = overrides(deploy)
    assert set(given) <= set(params), f"samconfig.toml sets parameters the template lacks: {set(given) - set(params)}"
    for name, value in given.items():
        assert value in params[name].get("AllowedValues", [value]), name
    assert set(QUESTIONS.values()) <= set(params) and len(QUESTIONS) <= 5
    unanswered = {name for name, spec in params.items() if "Default" not in spec} - set(given) - set(QUESTIONS.values())
    assert unanswered == set()
    # Graviton; never the profile, which would turn an existing production stack into a starter one on its next
    # deploy (make deploy gives a new stack starter: test_make_deploy_*).
    assert given == {"Architecture": "arm64"}
    # The template shows the same questions first in the console's form.
    [first] = [g for g in template["Metadata"]["AWS::CloudFormation::Interface"]["ParameterGroups"]
               if g["Label"]["default"] == "First deploy"]
    assert set(first["Parameters"]) == set(QUESTIONS.values())


def test_make_deploy_asks_exactly_those_questions_and_checks_first():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\ndeploy:"):]
    recipe = recipe[:recipe.index("\n\n")]
    asked = dict(re.findall(r"\$\(if \$\((\w+)\),(\w+)=\$\(\1\)\)", recipe))
    asked["ARCH"] = re.search(r"(\w+)=\$\(ARCH\)", recipe)[1]
    assert {var: asked.get(var) for var in QUESTIONS} == QUESTIONS
    lint, tests, check, deploy = (recipe.index(s) for s in ("lint", "pytest", "sam-check", "sam deploy"))
    assert lint < tests < check < deploy
    assert "Profile=starter" in recipe  # a new stack, when PROFILE is not given
    assert re.search(r"^\.DEFAULT_GOAL := help$", makefile, re.M)


def test_the_guide_files_every_parameter_under_when_it_is_needed(template):
    guide = (ROOT / "docs/DEPLOY.md").read_text()
    section = guide[guide.index("## Parameters, by when you need them"):]
    section = section[:section.index("\n## ", 1)]
    groups = re.split(r"^### ", section, flags=re.M)[1:]
    assert [g.splitlines()[0] for g in groups] == ["First deploy", "Going to production", "Tuning"]
    filed = [set(re.findall(r"`([A-Z]\w+)`", group)) & set(template["Parameters"]) for group in groups]
    assert set().union(*filed) == set(template["Parameters"]), "a parameter the guide does not file"
    assert filed[0] == set(QUESTIONS.values())
