# Run by tests/deploy/test_terraform.py with `terraform test` against a copy of the module.
# The AWS provider is mocked (apply included), so nothing leaves the machine.

mock_provider "aws" {
  # The real provider still validates what it is given (policies are JSON, ARNs are ARNs);
  # mocked values are random strings unless set here.
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }

  mock_resource "aws_lb" {
    defaults = {
      arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:loadbalancer/app/toren/1"
    }
  }

  mock_resource "aws_lb_target_group" {
    defaults = {
      arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/toren-api/1"
    }
  }

  mock_resource "aws_iam_role" {
    defaults = {
      arn = "arn:aws:iam::123456789012:role/toren"
    }
  }

  mock_resource "aws_secretsmanager_secret" {
    defaults = {
      arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:toren"
    }
  }

  mock_resource "aws_cloudwatch_log_group" {
    defaults = {
      arn = "arn:aws:logs:eu-west-1:123456789012:log-group:/toren"
    }
  }

  mock_resource "aws_appautoscaling_policy" {
    defaults = {
      arn = "arn:aws:autoscaling:eu-west-1:123456789012:scalingPolicy:1:resource/ecs/service/toren/worker:policyName/p"
    }
  }

  mock_resource "aws_ecs_task_definition" {
    defaults = {
      arn = "arn:aws:ecs:eu-west-1:123456789012:task-definition/toren:1"
    }
  }

  mock_resource "aws_ecs_cluster" {
    defaults = {
      arn = "arn:aws:ecs:eu-west-1:123456789012:cluster/toren"
    }
  }

  mock_resource "aws_db_instance" {
    defaults = {
      master_user_secret = [{ secret_arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rds-db" }]
    }
  }
}

variables {
  region             = "eu-west-1"
  certificate_arn    = "arn:aws:acm:eu-west-1:123456789012:certificate/test"
  vpc_id             = "vpc-0123456789abcdef0"
  public_subnet_ids  = ["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"]
  private_subnet_ids = ["subnet-0cccccccccccccccc", "subnet-0dddddddddddddddd"]
  image_tag          = "0123456789abcdef0123456789abcdef01234567"
}

run "a_full_sha_applies" {
  command = apply

  assert {
    condition     = aws_ecr_repository.this[0].image_tag_mutability == "IMMUTABLE"
    error_message = "the ECR repository must have immutable tags"
  }

  assert {
    condition     = aws_lb.this.idle_timeout >= 3600
    error_message = "the ALB idle timeout must outlast an idle SSE stream"
  }

  assert {
    condition     = endswith(jsondecode(aws_ecs_task_definition.this["worker"].container_definitions)[0].image, ":0123456789abcdef0123456789abcdef01234567")
    error_message = "the worker must run the pinned image tag"
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.this["api"].container_definitions)[0].command == ["serve", "--host", "0.0.0.0", "--port", "8080"]
    error_message = "the API task must run toren serve on 8080"
  }
}

run "latest_is_refused" {
  command = plan

  variables {
    image_tag = "latest"
  }

  expect_failures = [var.image_tag]
}

run "a_short_sha_is_refused" {
  command = plan

  variables {
    image_tag = "0123456"
  }

  expect_failures = [var.image_tag]
}
