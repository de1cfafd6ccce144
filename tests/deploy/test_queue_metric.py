"""The queue depth the AWS module's worker autoscaling follows: counted from the store,
published to CloudWatch (moto) as Toren/QueueDepth by deployment."""

from __future__ import annotations

import time
from typing import Any

import pytest

import toren
from toren.adapters.aws.queue_metric import QueueDepthPublisher
from toren.store import Store

moto = pytest.importorskip("moto")


async def agent(ctx: toren.Context, input: Any) -> Any:
    return input


async def test_queue_depth_counts_runnable_unclaimed_runs(store: Store) -> None:
    reg = toren.Registry()
    reg.add("a", agent)
    for i in range(5):
        await toren.start_run(store, reg, "a", i)
    now = time.time()
    assert await store.queue_depth(now=now) == 5
    await store.claim("w", 2, now=now, ttl=60)
    assert await store.queue_depth(now=now) == 3  # leased runs are not waiting
    assert await store.queue_depth(now=now + 120) == 5  # expired leases count again


async def test_publisher_puts_the_metric(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    reg = toren.Registry()
    reg.add("a", agent)
    for i in range(3):
        await toren.start_run(store, reg, "a", i)
    with moto.mock_aws():
        client = boto3.client("cloudwatch", region_name="eu-west-1")
        publisher = QueueDepthPublisher(store, "staging", client=client)
        assert await publisher.publish_once() == 3
        metrics = client.list_metrics(Namespace="Toren", MetricName="QueueDepth")["Metrics"]
        assert metrics[0]["Dimensions"] == [{"Name": "Deployment", "Value": "staging"}]
        stats = client.get_metric_statistics(
            Namespace="Toren",
            MetricName="QueueDepth",
            Dimensions=[{"Name": "Deployment", "Value": "staging"}],
            StartTime=time.time() - 600,
            EndTime=time.time() + 600,
            Period=60,
            Statistics=["Maximum"],
        )
        assert [p["Maximum"] for p in stats["Datapoints"]] == [3.0]
