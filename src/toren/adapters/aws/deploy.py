"""``toren deploy-aws``: build once, tag with the commit, pin the tag, apply.

The sequence, every external command going through a :class:`CommandRunner`::

    git rev-parse --show-toplevel                         read-only checks, run even
    git status --porcelain -z --untracked-files=all       under --dry-run
    git rev-parse HEAD
    ECR DescribeRepositories, DescribeImages               (boto3)
    ECR GetAuthorizationToken                              (boto3; skipped under --dry-run)
    docker login --username AWS --password-stdin HOST      } only when the tag is not in
    docker build -t URI:SHA .                              } ECR yet: an immutable tag is
    docker push URI:SHA                                    } built once, then promoted
    rewrite the ``image_tag = "..."`` line of the tfvars file, nothing else
    terraform -chdir=DIR init -input=false
    terraform -chdir=DIR plan -input=false -var-file=TFVARS -out=toren.tfplan
    (ask, unless --yes)
    terraform -chdir=DIR apply -input=false toren.tfplan

Applying the saved plan means what was approved is exactly what is applied. The tag is
the full SHA of a clean HEAD: a mutable tag (``latest``), a tag that is not HEAD, or
uncommitted changes would make "what runs in production" unanswerable, so each is
refused with a message saying what to do instead. The tfvars file itself may be dirty:
the last deploy's pin is the one change a retry is expected to find.
"""

from __future__ import annotations

import base64
import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from toren.adapters.aws.runner import Command, CommandRunner, SubprocessRunner, describe
from toren.errors import InfrastructureError, UserError

__all__ = [
    "PLAN_FILE",
    "AwsCallFailed",
    "DeployCommandFailed",
    "DeployEnvironment",
    "DeployRefused",
    "DeployRequest",
    "EcrRegistry",
    "MissingExtra",
    "deploy",
    "pin_image_tag",
]

PLAN_FILE = "toren.tfplan"
_SHA = re.compile(r"[0-9a-f]{40}")
# The whole line is matched so that only the value between the quotes is replaced;
# indentation, spacing, a trailing comment and the line ending are kept byte for byte.
_IMAGE_TAG_LINE = re.compile(r'^[ \t]*image_tag[ \t]*=[ \t]*"(?P<value>[^"\n]*)"', re.MULTILINE)


class DeployRefused(UserError):
    """The deploy would not name one immutable, committed image; nothing was run."""

    code = "deploy_refused"


class MissingExtra(UserError):
    code = "missing_extra"


class DeployCommandFailed(InfrastructureError):
    code = "deploy_command_failed"


class AwsCallFailed(InfrastructureError):
    code = "aws_call_failed"


@dataclass(frozen=True)
class DeployRequest:
    project_dir: Path
    terraform_dir: Path
    tfvars: Path
    region: str
    repository: str = "toren"
    tag: str | None = None
    dry_run: bool = False
    yes: bool = False


def _boto3_ecr_client(region: str) -> object:
    try:
        import boto3
    except ImportError as exc:
        raise MissingExtra(
            "toren deploy-aws needs boto3, which is not installed; "
            "install the AWS extra: pip install 'toren-run[aws]'"
        ) from exc
    return boto3.client("ecr", region_name=region)


@dataclass
class DeployEnvironment:
    """Everything ``deploy`` touches outside itself; tests pass fakes through click's obj."""

    runner: CommandRunner = field(default_factory=SubprocessRunner)
    ecr_client: Callable[[str], object] = _boto3_ecr_client
    echo: Callable[[str], None] = click.echo
    confirm: Callable[[str], bool] = lambda prompt: click.confirm(prompt, default=False)


# -- the tag ------------------------------------------------------------------------------


def _refuse_mutable_tag(tag: str | None) -> None:
    if tag is None:
        return
    if tag.strip().lower() == "latest":
        raise DeployRefused(
            "refusing --tag 'latest': a mutable tag cannot say which code is running and "
            "cannot be rolled back to. Omit --tag; toren deploy-aws tags the image with "
            "the full git SHA of HEAD."
        )
    if not _SHA.fullmatch(tag):
        raise DeployRefused(
            f"refusing --tag {tag!r}: it is not a full 40-character git commit SHA. "
            "Omit --tag to use HEAD's SHA (git rev-parse HEAD)."
        )


def _git(env: DeployEnvironment, project_dir: Path, *args: str) -> str:
    argv = ("git", *args)
    env.echo(f"$ {describe(argv)}")
    result = env.runner.run(Command(argv, cwd=project_dir, capture=True))
    if result.returncode != 0:
        raise DeployRefused(
            f"{describe(argv)!r} failed in {str(project_dir)!r}: {result.stderr.strip()}. "
            "Run toren deploy-aws from the git repository of the agent project."
        )
    return result.stdout


def _changed_paths(porcelain_z: str) -> list[str]:
    """Paths from ``git status --porcelain -z``; a rename's second field is its origin."""
    paths: list[str] = []
    fields = iter(porcelain_z.split("\0"))
    for entry in fields:
        if not entry:
            continue
        status, path = entry[:2], entry[3:]
        paths.append(path)
        if "R" in status or "C" in status:
            next(fields, None)
    return paths


def _clean_head_sha(env: DeployEnvironment, request: DeployRequest) -> str:
    top = Path(_git(env, request.project_dir, "rev-parse", "--show-toplevel").strip())
    status = _git(env, request.project_dir, "status", "--porcelain", "-z", "--untracked-files=all")
    try:
        own_pin = _tfvars_path(request).resolve().relative_to(top.resolve()).as_posix()
    except ValueError:
        own_pin = None
    dirty = [p for p in _changed_paths(status) if p != own_pin]
    if dirty:
        shown = ", ".join(repr(p) for p in dirty[:10]) + (" ..." if len(dirty) > 10 else "")
        raise DeployRefused(
            f"refusing to deploy: the working tree of {str(top)!r} is not clean "
            f"({len(dirty)} changed or untracked path(s): {shown}). The image is tagged with "
            "the commit SHA, so it must contain exactly that commit: commit or remove the "
            "changes, then run toren deploy-aws again."
        )
    sha = _git(env, request.project_dir, "rev-parse", "HEAD").strip()
    if not _SHA.fullmatch(sha):
        raise DeployRefused(f"git rev-parse HEAD printed {sha!r}, not a commit SHA")
    if request.tag is not None and request.tag != sha:
        raise DeployRefused(
            f"refusing --tag {request.tag!r}: it is not the current commit, HEAD is {sha!r}. "
            "An image is built from the working tree, so its tag must be HEAD's SHA: check "
            "out that commit, or omit --tag."
        )
    return sha


# -- the tfvars pin -----------------------------------------------------------------------


def _tfvars_path(request: DeployRequest) -> Path:
    """The tfvars file; a relative --tfvars is relative to the project, like -chdir."""
    return request.project_dir / request.tfvars


def pin_image_tag(text: str, sha: str, *, path: Path) -> str:
    """``text`` with the value of its one ``image_tag = "..."`` line replaced by ``sha``."""
    matches = list(_IMAGE_TAG_LINE.finditer(text))
    if len(matches) != 1:
        found = "no" if not matches else f"{len(matches)}"
        raise DeployRefused(
            f"{str(path)!r} has {found} 'image_tag = \"...\"' line(s); it needs exactly one, "
            f'e.g. image_tag = "{sha}"'
        )
    start, end = matches[0].span("value")
    return text[:start] + sha + text[end:]


def _read_tfvars(path: Path) -> str:
    try:
        # newline="" keeps CRLF line endings as they are when the file is written back.
        with path.open(encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        raise DeployRefused(
            f"no tfvars file at {str(path)!r}; copy terraform.tfvars.example from the "
            "toren.adapters.aws terraform module there, or pass --tfvars"
        ) from None


def _tfvars_diff(old: str, new: str, path: Path) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"{path} (before)",
        tofile=f"{path} (after)",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines).rstrip("\n")


# -- ECR ----------------------------------------------------------------------------------


@dataclass
class EcrRegistry:
    """The three ECR calls deploy-aws makes itself, over a boto3 ECR client."""

    client: Any

    def _fail(self, action: str, exc: Exception) -> AwsCallFailed:
        return AwsCallFailed(
            f"ECR {action} failed: {exc}. Check the AWS credentials and --region.",
        )

    def repository(self, name: str) -> tuple[str, str]:
        """(registry id, repository URI) of the repository ``name``."""
        try:
            found = self.client.describe_repositories(repositoryNames=[name])
        except self.client.exceptions.RepositoryNotFoundException:
            raise DeployRefused(
                f"ECR repository {name!r} does not exist in this account and region. Create "
                "it first (terraform apply -target='aws_ecr_repository.this' in the "
                "environment that owns it), or pass --repository."
            ) from None
        except Exception as exc:  # botocore's credential and endpoint errors
            raise self._fail("DescribeRepositories", exc) from exc
        repo = found["repositories"][0]
        return repo["registryId"], repo["repositoryUri"]

    def has_image(self, name: str, tag: str) -> bool:
        try:
            self.client.describe_images(repositoryName=name, imageIds=[{"imageTag": tag}])
        except self.client.exceptions.ImageNotFoundException:
            return False
        except Exception as exc:
            raise self._fail("DescribeImages", exc) from exc
        return True

    def login_password(self, registry_id: str) -> str:
        try:
            data = self.client.get_authorization_token(registryIds=[registry_id])
        except Exception as exc:
            raise self._fail("GetAuthorizationToken", exc) from exc
        token = data["authorizationData"][0]["authorizationToken"]
        user, _, password = base64.b64decode(token).decode().partition(":")
        if user != "AWS" or not password:
            raise AwsCallFailed("ECR returned an authorization token that is not 'AWS:<password>'")
        return str(password)


# -- the sequence -------------------------------------------------------------------------


@dataclass
class _Steps:
    env: DeployEnvironment
    dry_run: bool

    def run(self, argv: tuple[str, ...], *, cwd: Path, stdin: str | None = None) -> None:
        self.env.echo(f"{'[dry-run] ' if self.dry_run else ''}$ {describe(argv)}")
        if self.dry_run:
            return
        result = self.env.runner.run(Command(argv, cwd=cwd, stdin=stdin))
        if result.returncode != 0:
            detail = f": {result.stderr.strip()}" if result.stderr.strip() else ""
            raise DeployCommandFailed(
                f"{describe(argv)!r} exited with status {result.returncode}{detail}. "
                "Nothing after it was run; fix the cause and run toren deploy-aws again."
            )


def deploy(request: DeployRequest, env: DeployEnvironment) -> str:
    """Build, push, pin and apply; returns the deployed image (``URI:SHA``)."""
    _refuse_mutable_tag(request.tag)
    tfvars_before = _read_tfvars(_tfvars_path(request))
    sha = _clean_head_sha(env, request)
    tfvars_after = pin_image_tag(tfvars_before, sha, path=request.tfvars)

    registry = EcrRegistry(env.ecr_client(request.region))
    registry_id, repository_uri = registry.repository(request.repository)
    image = f"{repository_uri}:{sha}"
    steps = _Steps(env, request.dry_run)
    project = request.project_dir

    if registry.has_image(request.repository, sha):
        env.echo(f"{image} is already in ECR: not building it again (build once, promote).")
    else:
        host = repository_uri.split("/", 1)[0]
        password = None if request.dry_run else registry.login_password(registry_id)
        login = ("docker", "login", "--username", "AWS", "--password-stdin", host)
        steps.run(login, cwd=project, stdin=password)
        steps.run(("docker", "build", "-t", image, "."), cwd=project)
        steps.run(("docker", "push", image), cwd=project)

    _pin(request, env, tfvars_before, tfvars_after)
    if _apply(request, env, steps):
        env.echo(f"{'[dry-run] would deploy' if request.dry_run else 'Deployed'} {image}")
    return image


def _pin(request: DeployRequest, env: DeployEnvironment, before: str, after: str) -> None:
    if before == after:
        env.echo(f"{request.tfvars}: image_tag already pinned to this commit")
        return
    env.echo(_tfvars_diff(before, after, request.tfvars))
    if request.dry_run:
        env.echo(f"[dry-run] {request.tfvars} not written")
        return
    with _tfvars_path(request).open("w", encoding="utf-8", newline="") as f:
        f.write(after)


def _apply(request: DeployRequest, env: DeployEnvironment, steps: _Steps) -> bool:
    chdir = f"-chdir={request.terraform_dir}"
    var_file = f"-var-file={_tfvars_path(request).resolve()}"
    here = request.project_dir
    steps.run(("terraform", chdir, "init", "-input=false"), cwd=here)
    steps.run(("terraform", chdir, "plan", "-input=false", var_file, f"-out={PLAN_FILE}"), cwd=here)
    if not (request.yes or request.dry_run or env.confirm("Apply this plan?")):
        env.echo(f"Not applied. The image is pushed and pinned in {request.tfvars}.")
        return False
    steps.run(("terraform", chdir, "apply", "-input=false", PLAN_FILE), cwd=here)
    return True
