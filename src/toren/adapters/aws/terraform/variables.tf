# Required: no defaults, so a missing value stops `terraform plan` instead of guessing.

variable "image_tag" {
  description = "Full 40-character git commit SHA of the image in ECR. `toren deploy-aws` pins it; promote by copying the same SHA into the next environment's tfvars."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-f]{40}$", var.image_tag))
    error_message = "The image_tag must be a full 40-character lowercase git commit SHA. Mutable tags such as \"latest\" are refused: an immutable tag is what makes a rollback and a promotion deploy the same bytes."
  }
}

variable "certificate_arn" {
  description = "ACM certificate ARN for the ALB's HTTPS listener."
  type        = string
}

variable "region" {
  description = "AWS region, e.g. eu-west-1."
  type        = string
}

variable "vpc_id" {
  description = "VPC to deploy into."
  type        = string
}

variable "public_subnet_ids" {
  description = "Subnets for the internet-facing ALB (at least two availability zones)."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Subnets for the ECS tasks and RDS (at least two availability zones, with a NAT or VPC endpoints for ECR, Secrets Manager, CloudWatch and the model providers)."
  type        = list(string)
}

# Optional.

variable "name" {
  description = "Name of this deployment (e.g. toren-staging); prefixes every resource."
  type        = string
  default     = "toren"
}

variable "tags" {
  description = "Extra tags for every resource."
  type        = map(string)
  default     = {}
}

variable "create_ecr_repository" {
  description = "Create the ECR repository here. Set false in every environment but the one that owns it (e.g. production reads the repository staging created), so that one image is built once and promoted."
  type        = bool
  default     = true
}

variable "ecr_repository_name" {
  description = "ECR repository holding the images (`toren deploy-aws --repository`)."
  type        = string
  default     = "toren"
}

variable "provider_secret_names" {
  description = "Environment variables holding model-provider keys. Each becomes an empty Secrets Manager secret; put the value with `aws secretsmanager put-secret-value`."
  type        = list(string)
  default     = ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"]
}

variable "worker_cpu" {
  type    = number
  default = 512
}

variable "worker_memory" {
  type    = number
  default = 1024
}

variable "worker_min_count" {
  type    = number
  default = 2
}

variable "worker_max_count" {
  type    = number
  default = 10
}

variable "worker_scale_out_queue_depth" {
  description = "Scale the workers out while the Toren/QueueDepth metric (runnable runs waiting for a worker) stays above this."
  type        = number
  default     = 20
}

variable "worker_stop_timeout" {
  description = "Seconds between SIGTERM and SIGKILL for a worker: its drain window. Fargate allows at most 120."
  type        = number
  default     = 120
}

variable "api_cpu" {
  type    = number
  default = 512
}

variable "api_memory" {
  type    = number
  default = 1024
}

variable "api_count" {
  type    = number
  default = 2
}

variable "alb_idle_timeout" {
  description = "Seconds the ALB keeps an idle connection open. SSE event streams sit idle between events, so this is an hour rather than the 60-second default."
  type        = number
  default     = 3600
}

variable "db_instance_class" {
  type    = string
  default = "db.t4g.medium"
}

variable "db_allocated_storage" {
  type    = number
  default = 50
}

variable "db_multi_az" {
  type    = bool
  default = true
}

variable "db_engine_version" {
  type    = string
  default = "15"
}

variable "log_retention_days" {
  type    = number
  default = 30
}
