"""Publishing the queue depth to CloudWatch, which the Terraform module's worker
autoscaling follows (metric ``Toren/QueueDepth``, dimension ``Deployment``).

A worker started with ``TOREN_DEPLOYMENT`` (the ECS task definition sets it to the
module's ``name``) publishes every ``interval`` seconds the number of runs that are
runnable now and held by no worker. Several workers publishing the same figure is fine:
the alarms read the maximum.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from toren.core.contract.ports import RunStore

log = logging.getLogger("toren.aws")
NAMESPACE = "Toren"
METRIC = "QueueDepth"


class QueueDepthPublisher:
    def __init__(
        self,
        store: RunStore,
        deployment: str,
        *,
        region: str | None = None,
        interval: float = 60.0,
        client: object = None,
    ) -> None:
        self.store = store
        self.deployment = deployment
        self.interval = interval
        self._client = client
        self._region = region
        self._task: asyncio.Task[None] | None = None

    def _cloudwatch(self) -> Any:
        if self._client is None:
            try:
                import boto3
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise RuntimeError(
                    "publishing the queue depth needs boto3: pip install 'toren-run[aws]'"
                ) from exc
            self._client = boto3.client("cloudwatch", region_name=self._region)
        return self._client

    async def publish_once(self) -> int:
        depth = await self.store.queue_depth(now=time.time())
        await asyncio.to_thread(
            self._cloudwatch().put_metric_data,
            Namespace=NAMESPACE,
            MetricData=[
                {
                    "MetricName": METRIC,
                    "Dimensions": [{"Name": "Deployment", "Value": self.deployment}],
                    "Value": float(depth),
                    "Unit": "Count",
                }
            ],
        )
        return depth

    async def _loop(self) -> None:
        while True:
            try:
                await self.publish_once()
            except Exception as exc:  # a metrics outage must not stop the worker
                log.warning("could not publish %s/%s: %s", NAMESPACE, METRIC, exc)
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
