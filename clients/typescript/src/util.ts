import { TorenAPIError } from "./errors.js";
import type { Redactor } from "./redact.js";

/** The API's error body `{"error": {"code", "message", "details"}}`, or `http_error`. */
export function errorFromBody(
  redact: Redactor,
  status: number,
  statusText: string,
  text: string,
): TorenAPIError {
  try {
    const error = (JSON.parse(text) as { error: { code: unknown; message: unknown; details?: unknown } })
      .error;
    if (typeof error.code === "string" && typeof error.message === "string") {
      return new TorenAPIError(
        status,
        error.code,
        redact.text(error.message),
        redact.value(error.details ?? null),
      );
    }
  } catch {
    // not the API's error body: a proxy's page, an older server, a redirect
  }
  const message = text.slice(0, 500) || statusText || `HTTP ${status}`;
  return new TorenAPIError(status, "http_error", redact.text(message));
}

export function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    const inner = cause instanceof Error ? `: ${cause.message}` : "";
    return `${error.message}${inner}`;
  }
  return String(error);
}

/**
 * One signal aborted when any of `signals` is, and `dispose` to unhook it from them (a
 * long-lived signal of the caller's must not collect a listener per call).
 */
export function linkSignals(signals: (AbortSignal | undefined)[]): {
  signal: AbortSignal;
  dispose: () => void;
} {
  const controller = new AbortController();
  const hooks: (() => void)[] = [];
  for (const signal of signals) {
    if (!signal) continue;
    if (signal.aborted) {
      controller.abort(signal.reason);
      break;
    }
    const onAbort = () => controller.abort(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    hooks.push(() => signal.removeEventListener("abort", onAbort));
  }
  return { signal: controller.signal, dispose: () => hooks.forEach((unhook) => unhook()) };
}

/** `ms` milliseconds, or the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

