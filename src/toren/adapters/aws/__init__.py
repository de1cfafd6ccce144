"""Toren on AWS: a Terraform module (ECR, ECS Fargate, RDS, ALB, Secrets Manager, logs)
and ``toren deploy-aws``. Needs the extra ``toren-run[aws]`` (boto3) to deploy.

The module ships inside the package; :func:`terraform_module_dir` says where, so a
project can copy it into its own ``deploy/aws``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["terraform_module_dir"]


def terraform_module_dir() -> Path:
    """The directory of the packaged Terraform module (read-only: copy it, don't apply it)."""
    return Path(str(resources.files("toren.adapters.aws") / "terraform"))
