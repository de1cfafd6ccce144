# Workers scale on queue depth: runnable runs that no worker has claimed yet. The worker
# publishes it as the CloudWatch metric Toren/QueueDepth with the dimension
# Deployment = var.name (it gets the name as TOREN_DEPLOYMENT); with no data the alarms
# stay put, so the service holds at worker_min_count.

resource "aws_appautoscaling_target" "worker" {
  service_namespace  = "ecs"
  scalable_dimension = "ecs:service:DesiredCount"
  resource_id        = "service/${aws_ecs_cluster.this.name}/${aws_ecs_service.worker.name}"
  min_capacity       = var.worker_min_count
  max_capacity       = var.worker_max_count
}

resource "aws_appautoscaling_policy" "worker_out" {
  name               = "${var.name}-worker-scale-out"
  policy_type        = "StepScaling"
  service_namespace  = aws_appautoscaling_target.worker.service_namespace
  scalable_dimension = aws_appautoscaling_target.worker.scalable_dimension
  resource_id        = aws_appautoscaling_target.worker.resource_id

  step_scaling_policy_configuration {
    adjustment_type         = "ChangeInCapacity"
    cooldown                = 60
    metric_aggregation_type = "Maximum"

    step_adjustment {
      metric_interval_lower_bound = 0
      metric_interval_upper_bound = var.worker_scale_out_queue_depth * 4
      scaling_adjustment          = 1
    }

    step_adjustment {
      metric_interval_lower_bound = var.worker_scale_out_queue_depth * 4
      scaling_adjustment          = 3
    }
  }
}

resource "aws_appautoscaling_policy" "worker_in" {
  name               = "${var.name}-worker-scale-in"
  policy_type        = "StepScaling"
  service_namespace  = aws_appautoscaling_target.worker.service_namespace
  scalable_dimension = aws_appautoscaling_target.worker.scalable_dimension
  resource_id        = aws_appautoscaling_target.worker.resource_id

  step_scaling_policy_configuration {
    adjustment_type         = "ChangeInCapacity"
    cooldown                = 300
    metric_aggregation_type = "Maximum"

    step_adjustment {
      metric_interval_upper_bound = 0
      scaling_adjustment          = -1
    }
  }
}

resource "aws_cloudwatch_metric_alarm" "queue_high" {
  alarm_name          = "${var.name}-queue-depth-high"
  namespace           = "Toren"
  metric_name         = "QueueDepth"
  dimensions          = { Deployment = var.name }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 2
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.worker_scale_out_queue_depth
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_appautoscaling_policy.worker_out.arn]
}

resource "aws_cloudwatch_metric_alarm" "queue_low" {
  alarm_name          = "${var.name}-queue-depth-low"
  namespace           = "Toren"
  metric_name         = "QueueDepth"
  dimensions          = { Deployment = var.name }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 15
  comparison_operator = "LessThanOrEqualToThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_appautoscaling_policy.worker_in.arn]
}
