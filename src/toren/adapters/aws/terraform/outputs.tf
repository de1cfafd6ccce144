output "url" {
  description = "Point your DNS name at alb_dns_name; the API and console answer on https://<that name>/."
  value       = "https://${aws_lb.this.dns_name}"
}

output "alb_dns_name" {
  value = aws_lb.this.dns_name
}

output "ecr_repository_url" {
  value = local.ecr_repository_url
}

output "image" {
  description = "The image every task runs: repository URL and the pinned commit SHA."
  value       = local.image
}

output "cluster_name" {
  value = aws_ecs_cluster.this.name
}

output "api_token_secret_arn" {
  value = aws_secretsmanager_secret.api_token.arn
}

output "provider_secret_arns" {
  value = { for k, s in aws_secretsmanager_secret.provider : k => s.arn }
}
