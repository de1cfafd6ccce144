/**
 * The errors the client throws, mirroring the Python client's (`toren.client`):
 *
 *     TorenError                      every error of this package
 *     ├── TorenAPIError               the API answered with an error: status, code, message, details
 *     │   └── TorenConnectionError    the server could not be reached, or a stream could not resume
 *     └── TorenTimeoutError           wait() gave up before the run ended
 *
 * An aborted call (its AbortSignal fired) rejects with the signal's reason, as `fetch`
 * does (a DOMException named "AbortError" unless you gave another reason).
 */

/** The root of the package's errors. */
export class TorenError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/**
 * The API answered with an error. `code` is the server's stable code (`run_not_found`,
 * `unauthorized`, `invalid_request`, ...; see docs/http-api.md), `status` the HTTP status
 * (200 for an `error` message inside an event stream, 0 when no answer came), `message`
 * the server's words (scrubbed of secrets, see the README), and `details` what came with
 * them (the list of validation problems of a 422).
 *
 * Two codes come from the client itself: `http_error` when an error response is not the
 * API's JSON error (a proxy's HTML page, say), and `invalid_response` when a successful
 * response is not the JSON the API documents.
 */
export class TorenAPIError extends TorenError {
  readonly status: number;
  readonly code: string;
  readonly details: unknown;

  constructor(status: number, code: string, message: string, details?: unknown) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details ?? null;
  }

  /** `message (HTTP status, code)`, as the Python client's `str(error)`. */
  override toString(): string {
    const where = this.status ? `HTTP ${this.status}, ` : "";
    return `${this.name}: ${this.message} (${where}${this.code})`;
  }
}

/** The server could not be reached (or a stream broke and could not resume). */
export class TorenConnectionError extends TorenAPIError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(0, "connection_error", message);
    if (options?.cause !== undefined) {
      Object.defineProperty(this, "cause", { value: options.cause, enumerable: false });
    }
  }
}

/** `wait()` gave up: the run is still in flight after the timeout. */
export class TorenTimeoutError extends TorenError {
  readonly runId: string;
  readonly status: string;

  constructor(runId: string, status: string, timeoutMs: number) {
    super(`run '${runId}' is still ${status} after ${timeoutMs / 1000}s`);
    this.runId = runId;
    this.status = status;
  }
}
