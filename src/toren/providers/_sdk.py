"""What the two SDK providers (``openai``, ``anthropic``) share: the client they own or
were given (its own retries switched off, so Toren's retry loop is the only one), the
retry loop that knows billing, ``complete`` (one call, or a stream feeding ``on_delta``)
and ``aclose``. A provider module says only what differs: how to build its client, how
a request goes on its wire, and how a response or a stream comes back
(:meth:`SdkProvider._create`, :meth:`SdkProvider._stream`)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from typing import ClassVar, Generic, Protocol, Self, TypeVar

from toren.providers._retry import Attempt, Rand, Retrying, SdkErrors, Sleep
from toren.providers.base import DeltaCallback, ModelRequest, ModelResponse, RetryPolicy


class SdkClient(Protocol):
    """What Toren needs of an official SDK's async client."""

    @property
    def api_key(self) -> object: ...
    def with_options(self, *, max_retries: int) -> Self: ...
    async def close(self) -> None: ...


ClientT = TypeVar("ClientT", bound=SdkClient)


class SdkProvider(Generic[ClientT]):
    """:class:`~toren.providers.base.ModelProvider` over an official SDK's client.

    ``client`` injects a ready client (its retries are switched off and it is not closed
    by :meth:`aclose`); ``sleep`` is what waits between retries and ``rand`` draws their
    jitter (both injectable, so tests neither wait nor guess)."""

    name: ClassVar[str]
    errors: ClassVar[SdkErrors]  # the SDK's exceptions, for the retry loop

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy = RetryPolicy(),
        client: ClientT | None = None,
        *,
        sleep: Sleep = asyncio.sleep,
        rand: Rand = random.random,
    ) -> None:
        self._owns_client = client is None
        base = client if client is not None else self._connect(api_key, base_url, timeout)
        self._client = base.with_options(max_retries=0)
        secret = base.api_key if isinstance(base.api_key, str) else ""
        self._retrying = Retrying(self.name, self.errors, retry, timeout, sleep, (secret,), rand)

    # -- what a provider module says ---------------------------------------------------------

    def _connect(self, api_key: str | None, base_url: str | None, timeout: float) -> ClientT:
        """A new client from the key, the URL and the environment (or a clear error)."""
        raise NotImplementedError

    def _wire(self, request: ModelRequest) -> dict[str, object]:
        """The SDK call's keyword arguments for ``request``."""
        raise NotImplementedError

    async def _create(self, kwargs: Mapping[str, object], attempt: Attempt) -> ModelResponse:
        raise NotImplementedError

    async def _stream(
        self, kwargs: Mapping[str, object], on_delta: DeltaCallback, attempt: Attempt
    ) -> ModelResponse:
        raise NotImplementedError

    # -- the provider ------------------------------------------------------------------------

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        kwargs = self._wire(request)
        if on_delta is None:
            return await self._retrying.call(
                request.model, lambda attempt: self._create(kwargs, attempt)
            )
        return await self._retrying.call(
            request.model, lambda attempt: self._stream(kwargs, on_delta, attempt)
        )

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.close()
