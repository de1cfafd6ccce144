resource "aws_cloudwatch_log_group" "this" {
  for_each = toset(["api", "worker"])

  name              = "/toren/${var.name}/${each.key}"
  retention_in_days = var.log_retention_days
}

resource "aws_ecs_cluster" "this" {
  name = var.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

locals {
  task_environment = [
    # The password comes from PGPASSWORD (a secret below); libpq adds it to this URL.
    { name = "TOREN_DATABASE_URL", value = "postgresql://${aws_db_instance.this.username}@${aws_db_instance.this.endpoint}/${aws_db_instance.this.db_name}?sslmode=require" },
    # Every event records the code version that wrote it: the image's commit.
    { name = "TOREN_CODE_VERSION", value = var.image_tag },
    { name = "TOREN_DEPLOYMENT", value = var.name },
    # The API keeps an idle connection open longer than the ALB does, so the ALB is the
    # side that closes it: a backend closing first races the ALB's next request on it (a 502).
    { name = "TOREN_KEEP_ALIVE", value = tostring(var.alb_idle_timeout + 5) },
  ]

  task_secrets = concat(
    [
      { name = "TOREN_API_TOKEN", valueFrom = aws_secretsmanager_secret.api_token.arn },
      { name = "PGPASSWORD", valueFrom = "${local.db_secret_arn}:password::" },
    ],
    local.provider_secrets,
  )

  containers = {
    worker = {
      command     = ["worker"]
      ports       = []
      stopTimeout = var.worker_stop_timeout
    }
    api = {
      command     = ["serve", "--host", "0.0.0.0", "--port", "8080"]
      ports       = [{ containerPort = 8080, protocol = "tcp" }]
      stopTimeout = 30
    }
  }
}

resource "aws_ecs_task_definition" "this" {
  for_each = local.containers

  family                   = "${var.name}-${each.key}"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = each.key == "worker" ? var.worker_cpu : var.api_cpu
  memory                   = each.key == "worker" ? var.worker_memory : var.api_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = each.key == "worker" ? aws_iam_role.worker_task.arn : aws_iam_role.api_task.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  container_definitions = jsonencode([{
    name                   = each.key
    image                  = local.image
    essential              = true
    command                = each.value.command
    portMappings           = each.value.ports
    stopTimeout            = each.value.stopTimeout
    readonlyRootFilesystem = false
    environment            = local.task_environment
    secrets                = local.task_secrets
    healthCheck = {
      command     = ["CMD", "python", "-m", "toren.adapters.docker", "healthcheck"]
      interval    = 15
      timeout     = 5
      retries     = 3
      startPeriod = 30
    }
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        "awslogs-group"         = aws_cloudwatch_log_group.this[each.key].name
        "awslogs-region"        = var.region
        "awslogs-stream-prefix" = each.key
      }
    }
  }])
}

resource "aws_ecs_service" "worker" {
  name            = "worker"
  cluster         = aws_ecs_cluster.this.id
  task_definition = aws_ecs_task_definition.this["worker"].arn
  launch_type     = "FARGATE"
  desired_count   = var.worker_min_count

  # A rolling deploy: new workers start before old ones drain, and the invalidation-storm
  # guard lets the newest code version win any stream both touch.
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.worker.id]
    assign_public_ip = false
  }

  lifecycle {
    ignore_changes = [desired_count] # owned by the autoscaling below
  }
}

resource "aws_ecs_service" "api" {
  name            = "api"
  cluster         = aws_ecs_cluster.this.id
  task_definition = aws_ecs_task_definition.this["api"].arn
  launch_type     = "FARGATE"
  desired_count   = var.api_count

  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200
  health_check_grace_period_seconds  = 30

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.api.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.api.arn
    container_name   = "api"
    container_port   = 8080
  }

  depends_on = [aws_lb_listener.https]
}
