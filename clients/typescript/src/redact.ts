/**
 * What the client scrubs from the errors it throws, as the Python client and the server
 * do: its own token, the values of credential-like environment variables (on Node; a
 * browser has none) and strings shaped like provider keys. An error quotes the server (or
 * a proxy in between) verbatim, and error messages end up in logs.
 */

export const REDACTED = "[redacted]";
const KEY_SHAPES = /\bsk-[A-Za-z0-9_-]{16,}|\bAKIA[0-9A-Z]{16}\b/g;
const SECRET_NAMES = /(_API_KEY|_TOKEN|_SECRET|_SECRET_KEY|_PASSWORD)$/;
const MIN_SECRET = 8; // shorter values would redact ordinary words

function secretsFromEnv(): string[] {
  const env = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process
    ?.env;
  if (!env) return [];
  return Object.entries(env)
    .filter(([name, value]) => SECRET_NAMES.test(name.toUpperCase()) && value)
    .map(([, value]) => value as string);
}

export class Redactor {
  private readonly secrets: string[];

  constructor(secrets: Iterable<string | undefined>) {
    const all = new Set<string>();
    for (const secret of [...secrets, ...secretsFromEnv()]) {
      if (secret && secret.length >= MIN_SECRET) all.add(secret);
    }
    // Longest first, so a secret that contains another is removed whole.
    this.secrets = [...all].sort((a, b) => b.length - a.length);
  }

  text(value: string): string {
    for (const secret of this.secrets) value = value.split(secret).join(REDACTED);
    return value.replace(KEY_SHAPES, REDACTED);
  }

  /** A scrubbed copy of a JSON value (the `details` of an error). */
  value(value: unknown): unknown {
    if (typeof value === "string") return this.text(value);
    if (Array.isArray(value)) return value.map((item) => this.value(item));
    if (value !== null && typeof value === "object") {
      return Object.fromEntries(
        Object.entries(value).map(([k, v]) => [this.text(k), this.value(v)]),
      );
    }
    return value;
  }
}
