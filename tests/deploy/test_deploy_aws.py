"""`toren deploy-aws` end to end through click, in a real temporary git repository, with
ECR served by moto and every docker/terraform command caught by a recording runner."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from click.testing import CliRunner, Result
from moto import mock_aws

from toren.adapters.aws.deploy import (
    DeployEnvironment,
    DeployRefused,
    EcrRegistry,
    MissingExtra,
    _boto3_ecr_client,
    pin_image_tag,
)
from toren.adapters.aws.runner import Command, CommandResult, RecordingRunner, SubprocessRunner
from toren.cli.deploy_aws import deploy_aws

REGION = "eu-west-1"
OLD_TAG = "1111111111111111111111111111111111111111"
TFVARS = (
    "# staging\n"
    'region          = "eu-west-1"\n'
    'name            = "toren-staging"\n'
    '  image_tag   =   "' + OLD_TAG + '"   # pinned by toren deploy-aws\n'
    'other_image_tag = "keep-me"\n'
    'certificate_arn = "arn:aws:acm:eu-west-1:123456789012:certificate/abc"\n'
)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    project = tmp_path / "agent"
    (project / "deploy" / "aws").mkdir(parents=True)
    (project / "agent.yaml").write_text("name: demo\n")
    (project / "Dockerfile").write_text("FROM scratch\n")
    (project / "deploy" / "aws" / "terraform.tfvars").write_text(TFVARS)
    git(project, "init", "-q")
    git(project, "config", "user.email", "dev@example.com")
    git(project, "config", "user.name", "Dev")
    git(project, "config", "commit.gpgsign", "false")
    git(project, "add", ".")
    git(project, "commit", "-q", "-m", "agent")
    monkeypatch.chdir(project)
    return project


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        ecr = boto3.client("ecr", region_name=REGION)
        ecr.create_repository(repositoryName="toren", imageTagMutability="IMMUTABLE")
        yield ecr


def recording() -> RecordingRunner:
    """Real git (read-only, in the temporary repo); docker and terraform are only recorded."""
    return RecordingRunner(delegate=SubprocessRunner(), passthrough=lambda c: c.argv[0] == "git")


def invoke(
    runner: RecordingRunner, *args: str, confirm: bool = True
) -> tuple[Result, RecordingRunner]:
    env = DeployEnvironment(runner=runner, confirm=lambda prompt: confirm)
    result = CliRunner().invoke(deploy_aws, ["--region", REGION, *args], obj=env)
    return result, runner


def uri(ecr: Any) -> str:
    return str(ecr.describe_repositories()["repositories"][0]["repositoryUri"])


def expected_commands(
    ecr: Any, sha: str, repo: Path, *, build: bool = True
) -> list[tuple[str, ...]]:
    image = f"{uri(ecr)}:{sha}"
    tfvars = repo / "deploy" / "aws" / "terraform.tfvars"
    commands: list[tuple[str, ...]] = [
        ("git", "rev-parse", "--show-toplevel"),
        ("git", "status", "--porcelain", "-z", "--untracked-files=all"),
        ("git", "rev-parse", "HEAD"),
    ]
    if build:
        commands += [
            ("docker", "login", "--username", "AWS", "--password-stdin", image.split("/")[0]),
            ("docker", "build", "-t", image, "."),
            ("docker", "push", image),
        ]
    return commands + [
        ("terraform", "-chdir=deploy/aws", "init", "-input=false"),
        (
            "terraform",
            "-chdir=deploy/aws",
            "plan",
            "-input=false",
            f"-var-file={tfvars.resolve()}",
            "-out=toren.tfplan",
        ),
        ("terraform", "-chdir=deploy/aws", "apply", "-input=false", "toren.tfplan"),
    ]


def printed_commands(output: str) -> list[tuple[str, ...]]:
    import shlex

    lines = [line.removeprefix("[dry-run] ") for line in output.splitlines()]
    return [tuple(shlex.split(line[2:])) for line in lines if line.startswith("$ ")]


def pinned(sha: str) -> str:
    return TFVARS.replace(OLD_TAG, sha)


# -- the happy paths ----------------------------------------------------------------------


def test_dry_run_prints_every_command_and_the_diff_and_runs_only_git(repo: Path, aws: Any) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    result, runner = invoke(recording(), "--dry-run")
    assert result.exit_code == 0, result.output
    assert printed_commands(result.output) == expected_commands(aws, sha, repo)
    assert runner.argvs == expected_commands(aws, sha, repo)[:3]
    assert "[dry-run] $ docker build" in result.output
    assert f'-  image_tag   =   "{OLD_TAG}"   # pinned by toren deploy-aws' in result.output
    assert f'+  image_tag   =   "{sha}"   # pinned by toren deploy-aws' in result.output
    assert (repo / "deploy/aws/terraform.tfvars").read_text() == TFVARS
    assert git(repo, "status", "--porcelain") == ""


def test_deploy_runs_the_exact_sequence_and_pins_only_the_tag(repo: Path, aws: Any) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    result, runner = invoke(recording(), "--yes")
    assert result.exit_code == 0, result.output
    assert runner.argvs == expected_commands(aws, sha, repo)
    assert f"Deployed {uri(aws)}:{sha}" in result.output

    tfvars = (repo / "deploy/aws/terraform.tfvars").read_text()
    assert tfvars == pinned(sha)
    before, after = TFVARS.splitlines(keepends=True), tfvars.splitlines(keepends=True)
    changed = [n for n, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert changed == [3]
    assert git(repo, "status", "--porcelain") == "M deploy/aws/terraform.tfvars"


def test_the_ecr_password_goes_to_docker_on_stdin_only(repo: Path, aws: Any) -> None:
    token = aws.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    password = base64.b64decode(token).decode().partition(":")[2]
    result, runner = invoke(recording(), "--yes")
    assert result.exit_code == 0, result.output
    (login,) = [c for c in runner.commands if c.argv[:2] == ("docker", "login")]
    assert login.stdin == password
    assert all(password not in " ".join(c.argv) for c in runner.commands)
    assert password not in result.output


def test_without_yes_the_plan_is_applied_only_when_confirmed(repo: Path, aws: Any) -> None:
    result, runner = invoke(recording(), confirm=False)
    assert result.exit_code == 0, result.output
    assert runner.argvs[-1][2] == "plan"
    assert not any("apply" in argv for argv in runner.argvs)
    assert "Not applied" in result.output

    result, runner = invoke(recording(), confirm=True)
    assert result.exit_code == 0, result.output
    assert runner.argvs[-1][2:] == ("apply", "-input=false", "toren.tfplan")


def test_an_image_already_in_ecr_is_promoted_not_rebuilt(repo: Path, aws: Any) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": 1,
            "digest": "sha256:" + "0" * 64,
        },
        "layers": [],
    }
    aws.put_image(repositoryName="toren", imageManifest=json.dumps(manifest), imageTag=sha)
    result, runner = invoke(recording(), "--yes")
    assert result.exit_code == 0, result.output
    assert runner.argvs == expected_commands(aws, sha, repo, build=False)
    assert "already in ECR" in result.output


def test_explicit_tag_equal_to_head_is_accepted(repo: Path, aws: Any) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    result, _ = invoke(recording(), "--dry-run", "--tag", sha)
    assert result.exit_code == 0, result.output


def test_a_retry_may_find_its_own_tfvars_pin_uncommitted(repo: Path, aws: Any) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    (repo / "deploy/aws/terraform.tfvars").write_text(pinned(sha))
    result, runner = invoke(recording(), "--yes")
    assert result.exit_code == 0, result.output
    assert "already pinned" in result.output
    assert runner.argvs[-1][2] == "apply"


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("tag", ["latest", "LATEST", " latest"])
def test_refuses_latest_before_running_anything(repo: Path, aws: Any, tag: str) -> None:
    result, runner = invoke(recording(), "--dry-run", "--tag", tag)
    assert result.exit_code == 5
    assert "refusing --tag 'latest'" in result.output
    assert "mutable" in result.output and "Omit --tag" in result.output
    assert runner.commands == []


@pytest.mark.parametrize("tag", ["v1.2.3", "abc1234", "A" * 40])
def test_refuses_a_tag_that_is_not_a_full_sha(repo: Path, aws: Any, tag: str) -> None:
    result, runner = invoke(recording(), "--tag", tag)
    assert result.exit_code == 5
    assert f"refusing --tag {tag!r}: it is not a full 40-character git commit SHA" in result.output
    assert runner.commands == []


def test_refuses_a_tag_that_is_not_head(repo: Path, aws: Any) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    result, runner = invoke(recording(), "--tag", OLD_TAG, "--yes")
    assert result.exit_code == 5
    assert f"refusing --tag '{OLD_TAG}': it is not the current commit, HEAD is '{sha}'" in (
        result.output
    )
    assert {argv[0] for argv in runner.argvs} == {"git"}
    assert (repo / "deploy/aws/terraform.tfvars").read_text() == TFVARS


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda repo: (repo / "agent.yaml").write_text("name: changed\n"), "agent.yaml"),
        (lambda repo: (repo / "tools.py").write_text("x = 1\n"), "tools.py"),
        (lambda repo: (repo / "agent.yaml").rename(repo / "moved.yaml"), "agent.yaml"),
    ],
    ids=["modified", "untracked", "deleted"],
)
def test_refuses_a_dirty_working_tree(repo: Path, aws: Any, change: Any, path: str) -> None:
    change(repo)
    result, runner = invoke(recording(), "--dry-run")
    assert result.exit_code == 5
    assert "the working tree of" in result.output and "is not clean" in result.output
    assert repr(path) in result.output
    assert "commit or remove the changes" in result.output
    assert ("git", "rev-parse", "HEAD") not in runner.argvs
    assert not any(argv[0] in ("docker", "terraform") for argv in runner.argvs)


def test_refuses_outside_a_git_repository(tmp_path: Path, aws: Any, monkeypatch: Any) -> None:
    (tmp_path / "deploy/aws").mkdir(parents=True)
    (tmp_path / "deploy/aws/terraform.tfvars").write_text(TFVARS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    result, runner = invoke(recording(), "--dry-run")
    assert result.exit_code == 5
    assert "'git rev-parse --show-toplevel' failed" in result.output
    assert "from the git repository of the agent project" in result.output


def test_refuses_a_tfvars_file_without_one_image_tag_line(repo: Path, aws: Any) -> None:
    tfvars = repo / "deploy/aws/terraform.tfvars"
    tfvars.write_text('region = "eu-west-1"\n')
    git(repo, "commit", "-qam", "no tag")
    result, _ = invoke(recording(), "--dry-run")
    assert result.exit_code == 5
    assert "has no 'image_tag = \"...\"' line(s); it needs exactly one" in result.output
    result, _ = invoke(recording(), "--dry-run", "--tfvars", "deploy/aws/missing.tfvars")
    assert result.exit_code == 5
    assert f"no tfvars file at {str(repo / 'deploy/aws/missing.tfvars')!r}" in result.output


def test_refuses_an_unknown_repository(repo: Path, aws: Any) -> None:
    result, runner = invoke(recording(), "--dry-run", "--repository", "nope")
    assert result.exit_code == 5
    assert "ECR repository 'nope' does not exist" in result.output


def test_a_failed_build_stops_before_push_pin_and_apply(repo: Path, aws: Any) -> None:
    runner = recording()
    runner.responses[("docker", "build")] = CommandResult(1, "", "no space left on device")
    result, _ = invoke(runner, "--yes")
    assert result.exit_code == 5
    assert "exited with status 1: no space left on device" in result.output
    assert runner.argvs[-1][:2] == ("docker", "build")
    assert (repo / "deploy/aws/terraform.tfvars").read_text() == TFVARS


# -- the parts ----------------------------------------------------------------------------


def test_pin_keeps_every_other_byte() -> None:
    sha = "f" * 40
    text = 'a = 1\r\n\timage_tag="old" // comment\r\nb = "image_tag = \\"x\\""\r\n'
    assert pin_image_tag(text, sha, path=Path("t")) == text.replace('"old"', f'"{sha}"')
    with pytest.raises(DeployRefused, match="has 2 'image_tag"):
        pin_image_tag('image_tag = "a"\nimage_tag = "b"\n', sha, path=Path("t"))


def test_ecr_calls_against_moto(aws: Any) -> None:
    registry = EcrRegistry(boto3.client("ecr", region_name=REGION))
    registry_id, repository_uri = registry.repository("toren")
    assert (registry_id, repository_uri) == ("123456789012", uri(aws))
    assert registry.has_image("toren", "a" * 40) is False
    token = aws.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    assert "AWS:" + registry.login_password(registry_id) == base64.b64decode(token).decode()
    with pytest.raises(DeployRefused, match="ECR repository 'missing' does not exist"):
        registry.repository("missing")


def test_a_missing_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(MissingExtra, match=r"pip install 'toren-run\[aws\]'"):
        _boto3_ecr_client(REGION)


def test_subprocess_runner_runs_and_reports_missing_commands(tmp_path: Path) -> None:
    runner = SubprocessRunner()
    done = runner.run(Command(("git", "--version"), cwd=tmp_path, capture=True))
    assert done.returncode == 0 and done.stdout.startswith("git version")
    fed = runner.run(Command(("cat",), stdin="secret", capture=True))
    assert fed.stdout == "secret"
    assert runner.run(Command(("no-such-command-toren",))).returncode == 127
