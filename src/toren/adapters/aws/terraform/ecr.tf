resource "aws_ecr_repository" "this" {
  count = var.create_ecr_repository ? 1 : 0

  name = var.ecr_repository_name
  # A pushed tag can never point at other bytes: the SHA in tfvars names one image forever.
  image_tag_mutability = "IMMUTABLE"

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "AES256"
  }
}

data "aws_ecr_repository" "existing" {
  count = var.create_ecr_repository ? 0 : 1
  name  = var.ecr_repository_name
}

locals {
  ecr_repository_arn = var.create_ecr_repository ? aws_ecr_repository.this[0].arn : data.aws_ecr_repository.existing[0].arn
  ecr_repository_url = var.create_ecr_repository ? aws_ecr_repository.this[0].repository_url : data.aws_ecr_repository.existing[0].repository_url
  image              = "${local.ecr_repository_url}:${var.image_tag}"
}
