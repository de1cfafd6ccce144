"""The AWS Terraform module, parsed with python-hcl2: required inputs, the immutable image
tag, and a network where only the ALB's 443 faces the world."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import hcl2
import pytest

from toren.adapters.aws import terraform_module_dir
from toren.adapters.aws.deploy import pin_image_tag

MODULE = terraform_module_dir()
SHA = "0123456789abcdef0123456789abcdef01234567"
WORLD = {"0.0.0.0/0", "::/0"}
REQUIRED = {
    "image_tag",
    "certificate_arn",
    "region",
    "vpc_id",
    "public_subnet_ids",
    "private_subnet_ids",
}


def _unquote(value: Any) -> Any:
    """python-hcl2 keeps string quotes ('"x"') and wraps expressions in ${...}."""
    if isinstance(value, str):
        if len(value) >= 2 and value[0] == value[-1] == '"':
            return value[1:-1]
        if value.startswith("${") and value.endswith("}"):
            return value[2:-1]
        return value
    if isinstance(value, list):
        return [_unquote(v) for v in value]
    if isinstance(value, dict):
        return {_unquote(k): _unquote(v) for k, v in value.items() if k != "__is_block__"}
    return value


@pytest.fixture(scope="module")
def module() -> dict[str, list[Any]]:
    merged: dict[str, list[Any]] = {}
    for tf in sorted(MODULE.glob("*.tf")):
        with tf.open() as f:
            for key, blocks in _unquote(hcl2.load(f)).items():
                merged.setdefault(key, []).extend(blocks)
    return merged


@pytest.fixture(scope="module")
def variables(module: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    return {name: body for block in module["variable"] for name, body in block.items()}


def resources(module: dict[str, list[Any]], kind: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for block in module.get("resource", []):
        for name, body in block.get(kind, {}).items():
            found[name] = body
    return found


def one(module: dict[str, list[Any]], kind: str) -> dict[str, Any]:
    (body,) = resources(module, kind).values()
    return body


def test_the_module_ships_inside_the_package() -> None:
    assert MODULE.is_dir()
    names = {p.name for p in MODULE.iterdir()}
    assert {"variables.tf", "ecs.tf", "terraform.tfvars.example"} <= names


def test_required_variables_have_no_default(variables: dict[str, dict[str, Any]]) -> None:
    required = {name for name, body in variables.items() if "default" not in body}
    assert required == REQUIRED


def test_no_latest_anywhere_as_a_default(variables: dict[str, dict[str, Any]]) -> None:
    for name, body in variables.items():
        assert "latest" not in str(body.get("default", "")).lower(), name
    for tf in MODULE.glob("*.tf"):
        assert ":latest" not in tf.read_text(), tf.name


def test_image_tag_is_validated_as_a_full_git_sha(variables: dict[str, dict[str, Any]]) -> None:
    (validation,) = variables["image_tag"]["validation"]
    condition = validation["condition"]
    match = re.fullmatch(r'can\(regex\("(?P<pattern>[^"]+)", var\.image_tag\)\)', condition)
    assert match, condition
    pattern = re.compile(match["pattern"])
    assert pattern.search(SHA)
    for bad in ("latest", SHA[:12], SHA.upper(), SHA + "0", "v1.2.3", f"{SHA}-dirty", ""):
        assert not pattern.search(bad), bad
    assert "latest" in validation["error_message"]


def test_ecr_tags_are_immutable_and_scanned(module: dict[str, list[Any]]) -> None:
    repo = one(module, "aws_ecr_repository")
    assert repo["image_tag_mutability"] == "IMMUTABLE"
    assert repo["image_scanning_configuration"][0]["scan_on_push"] is True


def test_alb_is_https_only_with_an_idle_timeout_for_sse(
    module: dict[str, list[Any]], variables: dict[str, dict[str, Any]]
) -> None:
    alb = one(module, "aws_lb")
    assert alb["idle_timeout"] == "var.alb_idle_timeout"
    assert variables["alb_idle_timeout"]["default"] >= 3600
    (listener,) = resources(module, "aws_lb_listener").values()
    assert (listener["port"], listener["protocol"]) == (443, "HTTPS")
    assert listener["certificate_arn"] == "var.certificate_arn"
    target = one(module, "aws_lb_target_group")
    assert target["health_check"][0]["path"] == "/v1/health"


def _ingress_rules(module: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every ingress rule in whichever of the three ways Terraform can say it."""
    rules = list(resources(module, "aws_vpc_security_group_ingress_rule").values())
    for rule in resources(module, "aws_security_group_rule").values():
        if rule["type"] == "ingress":
            rules.append(
                {
                    **rule,
                    "cidr_ipv4": rule.get("cidr_blocks"),
                    "cidr_ipv6": rule.get("ipv6_cidr_blocks"),
                }
            )
    for name, group in resources(module, "aws_security_group").items():
        for rule in group.get("ingress", []):
            rules.append(
                {
                    **rule,
                    "security_group_id": f"aws_security_group.{name}.id",
                    "cidr_ipv4": rule.get("cidr_blocks"),
                    "cidr_ipv6": rule.get("ipv6_cidr_blocks"),
                }
            )
    return rules


def _cidrs(rule: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for key in ("cidr_ipv4", "cidr_ipv6"):
        value = rule.get(key)
        found.update(value if isinstance(value, list) else [value] if value else [])
    return found


def test_only_the_albs_443_is_open_to_the_world(module: dict[str, list[Any]]) -> None:
    rules = _ingress_rules(module)
    assert rules
    open_rules = [r for r in rules if _cidrs(r) & WORLD]
    assert {frozenset(_cidrs(r)) for r in open_rules} == {
        frozenset({"0.0.0.0/0"}),
        frozenset({"::/0"}),
    }
    for rule in open_rules:
        assert rule["security_group_id"] == "aws_security_group.alb.id"
        assert (rule["from_port"], rule["to_port"], rule["ip_protocol"]) == (443, 443, "tcp")
    # Every other ingress names a security group as its source, never a CIDR.
    for rule in rules:
        if rule in open_rules:
            continue
        assert not _cidrs(rule), rule
        source = rule["referenced_security_group_id"]
        sources = list(rule["for_each"].values()) if source == "each.value" else [source]
        for s in sources:
            assert re.fullmatch(r"aws_security_group\.\w+\.id", s), rule


def test_database_and_tasks_are_private(module: dict[str, list[Any]]) -> None:
    db = one(module, "aws_db_instance")
    assert db["engine"] == "postgres"
    assert db["publicly_accessible"] is False
    assert db["storage_encrypted"] is True
    assert db["manage_master_user_password"] is True
    for name, service in resources(module, "aws_ecs_service").items():
        assert service["launch_type"] == "FARGATE", name
        assert service["network_configuration"][0]["assign_public_ip"] is False, name
    assert set(resources(module, "aws_ecs_service")) == {"worker", "api"}


def test_execution_role_reads_only_toren_secrets(module: dict[str, list[Any]]) -> None:
    docs = {
        name: body
        for block in module["data"]
        for name, body in block.get("aws_iam_policy_document", {}).items()
    }
    statements = {s["sid"]: s for s in docs["execution"]["statement"]}
    assert statements["Secrets"]["actions"] == ["secretsmanager:GetSecretValue"]
    assert statements["Secrets"]["resources"] == "local.task_secret_arns"
    wildcard = {sid for sid, s in statements.items() if s["resources"] == ["*"]}
    assert wildcard == {"EcrAuth"}, "only GetAuthorizationToken may use Resource '*'"
    assert statements["EcrAuth"]["actions"] == ["ecr:GetAuthorizationToken"]
    locals_ = {k: v for block in module["locals"] for k, v in block.items()}
    secret_arns = locals_["task_secret_arns"]
    assert "aws_secretsmanager_secret.api_token.arn" in secret_arns
    assert "*" not in secret_arns


def test_worker_scales_on_the_queue_depth_metric(module: dict[str, list[Any]]) -> None:
    alarms = resources(module, "aws_cloudwatch_metric_alarm")
    assert alarms
    for name, alarm in alarms.items():
        assert (alarm["namespace"], alarm["metric_name"]) == ("Toren", "QueueDepth"), name
        assert "aws_appautoscaling_policy.worker_" in alarm["alarm_actions"][0]
    target = one(module, "aws_appautoscaling_target")
    assert "aws_ecs_service.worker.name" in target["resource_id"]


def test_log_groups_have_retention(module: dict[str, list[Any]]) -> None:
    group = one(module, "aws_cloudwatch_log_group")
    assert group["retention_in_days"] == "var.log_retention_days"


def test_example_tfvars_sets_every_required_variable_and_can_be_pinned() -> None:
    example = (MODULE / "terraform.tfvars.example").read_text()
    values = _unquote(hcl2.loads(example))
    assert set(values) >= REQUIRED
    pinned = _unquote(hcl2.loads(pin_image_tag(example, SHA, path=Path("x"))))
    assert pinned == {**values, "image_tag": SHA}


def test_terraform_fmt_is_clean() -> None:
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed")
    result = subprocess.run(
        [terraform, "fmt", "-check", "-recursive", "-diff", str(MODULE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # the AWS provider plugin is started for every plan and apply
def test_terraform_test_plans_and_applies_with_a_mocked_provider(tmp_path: Path) -> None:
    """`terraform validate` and `terraform test` (tests/deploy/terraform/*.tftest.hcl) with
    the AWS provider from a local plugin directory, mocked: no network, no account."""
    terraform = shutil.which("terraform")
    plugins = Path(os.environ.get("TOREN_TF_PLUGIN_DIR", "/opt/tf-plugins"))
    if terraform is None or not (plugins / "registry.terraform.io/hashicorp/aws").is_dir():
        pytest.skip(f"terraform with the hashicorp/aws provider under {plugins} is not installed")
    module = tmp_path / "module"
    shutil.copytree(MODULE, module)
    shutil.copytree(Path(__file__).parent / "terraform", module / "tests")
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1", "NO_COLOR": "1"}

    def tf(*args: str) -> str:
        result = subprocess.run(
            [terraform, f"-chdir={module}", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
            env=env,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    tf("init", "-input=false", "-backend=false", f"-plugin-dir={plugins}", "-no-color")
    assert "The configuration is valid" in tf("validate", "-no-color")
    out = tf("test", "-no-color")
    assert "3 passed, 0 failed" in out, out
