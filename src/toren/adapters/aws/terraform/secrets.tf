resource "aws_secretsmanager_secret" "api_token" {
  name        = "${var.name}/TOREN_API_TOKEN"
  description = "Bearer token for the Toren HTTP API. Put the value with aws secretsmanager put-secret-value."
}

resource "aws_secretsmanager_secret" "provider" {
  for_each = toset(var.provider_secret_names)

  name        = "${var.name}/${each.value}"
  description = "Model provider key ${each.value} for Toren. Put the value with aws secretsmanager put-secret-value."
}

locals {
  # RDS keeps the master password in its own Secrets Manager secret (JSON with username
  # and password); the tasks get the password as PGPASSWORD, which libpq reads, so the
  # database URL itself carries no secret.
  db_secret_arn = aws_db_instance.this.master_user_secret[0].secret_arn

  task_secret_arns = concat(
    [aws_secretsmanager_secret.api_token.arn, local.db_secret_arn],
    [for s in aws_secretsmanager_secret.provider : s.arn],
  )

  provider_secrets = [
    for env_name, s in aws_secretsmanager_secret.provider : { name = env_name, valueFrom = s.arn }
  ]
}
