"""Model providers: ``openai``, ``anthropic`` and the offline ``scripted`` one."""

from toren.providers.base import (
    ModelProvider,
    ModelRequest,
    ModelResponse,
    RetryPolicy,
    ToolCall,
    ToolSpec,
    Usage,
)

__all__ = [
    "ModelProvider",
    "ModelRequest",
    "ModelResponse",
    "RetryPolicy",
    "ToolCall",
    "ToolSpec",
    "Usage",
]
