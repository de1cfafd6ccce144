"""The ``toren deploy-aws`` command. The main ``toren`` group registers :data:`deploy_aws`.

Tests (and embedders) inject a :class:`DeployEnvironment` as click's context object;
without one the real subprocess runner and boto3 are used.
"""

from __future__ import annotations

from pathlib import Path

import click

from toren.adapters.aws.deploy import DeployEnvironment, DeployRequest, deploy
from toren.cli._common import Refused
from toren.errors import TorenError

__all__ = ["deploy_aws"]


@click.command("deploy-aws")
@click.option(
    "--terraform-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("deploy/aws"),
    show_default=True,
    help="Terraform root module to apply (a copy of toren's module, with your backend).",
)
@click.option(
    "--tfvars",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Variables file whose image_tag line is pinned. [default: TERRAFORM_DIR/terraform.tfvars]",
)
@click.option(
    "--region",
    envvar=["AWS_REGION", "AWS_DEFAULT_REGION"],
    required=True,
    help="AWS region of the ECR repository. [env: AWS_REGION, AWS_DEFAULT_REGION]",
)
@click.option("--repository", default="toren", show_default=True, help="ECR repository name.")
@click.option("--tag", default=None, help="Expected image tag: must be HEAD's full SHA.")
@click.option("--dry-run", is_flag=True, help="Print every command and the tfvars change only.")
@click.option("--yes", is_flag=True, help="Apply the Terraform plan without asking.")
@click.pass_context
def deploy_aws(
    ctx: click.Context,
    terraform_dir: Path,
    tfvars: Path | None,
    region: str,
    repository: str,
    tag: str | None,
    dry_run: bool,
    yes: bool,
) -> None:
    """Build the image once, tag it with HEAD's git SHA, push it to ECR, pin it, apply.

    Refuses 'latest', a --tag other than HEAD's SHA, and a dirty working tree. Read-only
    checks (git, ECR lookups) run even with --dry-run; nothing is built, pushed, written
    or applied. Without --yes, the Terraform plan is shown and applied only if you agree.
    """
    env = ctx.find_object(DeployEnvironment) or DeployEnvironment()
    request = DeployRequest(
        project_dir=Path.cwd(),
        terraform_dir=terraform_dir,
        tfvars=tfvars if tfvars is not None else terraform_dir / "terraform.tfvars",
        region=region,
        repository=repository,
        tag=tag,
        dry_run=dry_run,
        yes=yes,
    )
    try:
        deploy(request, env)
    except TorenError as exc:
        raise Refused(exc.message) from exc
