/**
 * Real Toren processes for the tests: `toren serve`, `toren worker` and `toren dev`,
 * started from this repository's Python sources (PYTHONPATH=<repo>/src) on a SQLite
 * database in a temporary directory, with the offline `scripted` model. Set TOREN_PYTHON
 * to choose the interpreter (default `python3`).
 */

import { spawn, type ChildProcess } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** clients/typescript (this file runs from .build/test/). */
export const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const REPO = resolve(PACKAGE, "..", "..");
export const TOKEN = "tok-typescript-client-0123456789";
const FIXTURES = join(PACKAGE, "test", "fixtures", "agents");

export function pythonEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (!key.startsWith("TOREN_") || key === "TOREN_PYTHON") env[key] = value;
  }
  const src = join(REPO, "src");
  env["PYTHONPATH"] = env["PYTHONPATH"] ? `${src}${delimiter}${env["PYTHONPATH"]}` : src;
  env["PYTHONDONTWRITEBYTECODE"] = "1";
  env["PYTHONUNBUFFERED"] = "1";
  return { ...env, ...extra };
}

export async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => ok(typeof address === "object" && address ? address.port : 0));
    });
  });
}

/** Polls `check` every 50 ms until it returns a truthy value; fails after `timeout` ms. */
export async function waitFor<T>(
  check: () => T | Promise<T>,
  what: string,
  timeout = 30_000,
): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeout;
  let last: unknown;
  for (;;) {
    try {
      const value = await check();
      if (value) return value as NonNullable<T>;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeout / 1000}s waiting for ${what}`, { cause: last });
    }
    await new Promise((ok) => setTimeout(ok, 50));
  }
}

const alive = new Set<ChildProcess>();
// A test process that dies with a failure must not leave servers behind.
process.on("exit", () => {
  for (const child of alive) child.kill("SIGKILL");
});

/** A `toren` subprocess; its output is kept for failure messages. */
export class TorenProcess {
  readonly child: ChildProcess;
  output = "";

  constructor(args: string[], env: NodeJS.ProcessEnv) {
    const python = process.env["TOREN_PYTHON"] ?? "python3";
    this.child = spawn(python, ["-c", "from toren.cli.main import main; main()", ...args], {
      env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    alive.add(this.child);
    this.child.once("exit", () => alive.delete(this.child));
    const keep = (chunk: Buffer) => {
      this.output = (this.output + chunk.toString()).slice(-20_000);
    };
    this.child.stdout?.on("data", keep);
    this.child.stderr?.on("data", keep);
  }

  get running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Sends `signal` and waits for the process to exit (SIGKILL after 20 s). */
  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    if (!this.running) return;
    const exited = new Promise<void>((ok) => this.child.once("exit", () => ok()));
    this.child.kill(signal);
    const timer = setTimeout(() => this.child.kill("SIGKILL"), 20_000);
    await exited;
    clearTimeout(timer);
  }
}

/** A project of the `demo` agent copied to a temporary directory, and its database. */
export class Project {
  readonly dir = mkdtempSync(join(tmpdir(), "toren-ts-client-"));
  readonly agents = join(this.dir, "agents");
  readonly database = `sqlite:///${join(this.dir, "toren.db")}`;
  readonly ledger = join(this.dir, "ledger.jsonl");
  private readonly processes: TorenProcess[] = [];

  constructor() {
    cpSync(FIXTURES, this.agents, { recursive: true });
  }

  private env(): NodeJS.ProcessEnv {
    return pythonEnv({
      TOREN_DATABASE_URL: this.database,
      TOREN_AGENTS: this.agents,
      TOREN_SCRIPTED_LEDGER: this.ledger,
    });
  }

  private start(args: string[], extra: Record<string, string> = {}): TorenProcess {
    const proc = new TorenProcess(args, { ...this.env(), ...extra });
    this.processes.push(proc);
    return proc;
  }

  /** `toren serve` on `port` with the test token; resolves once /v1/health answers. */
  async serve(port: number, tokens = [TOKEN]): Promise<TorenProcess> {
    const proc = this.start(["serve", "--port", String(port), "--no-console", "--log-level", "warning"], {
      TOREN_API_TOKEN: tokens.join(","),
    });
    await this.healthy(proc, port);
    return proc;
  }

  /** `toren worker` beside the server. */
  worker(): TorenProcess {
    return this.start(["worker", "--concurrency", "20", "--drain-window", "1", "--log-level", "warning"], {
      TOREN_LEASE_HEARTBEAT: "0.3",
    });
  }

  /** `toren dev` (worker, API and live token deltas in one process; no token on loopback). */
  async dev(port: number): Promise<TorenProcess> {
    const proc = this.start(["dev", this.agents, "--port", String(port), "--no-console"]);
    await this.healthy(proc, port);
    return proc;
  }

  private async healthy(proc: TorenProcess, port: number): Promise<void> {
    await waitFor(
      async () => {
        if (!proc.running) {
          throw new Error(`toren exited with ${proc.child.exitCode}:\n${proc.output}`);
        }
        const response = await fetch(`http://127.0.0.1:${port}/v1/health`);
        return response.ok;
      },
      `toren on port ${port} to answer /v1/health`,
      60_000,
    ).catch((error: Error) => {
      throw new Error(`${error.message}\n${proc.output}`, { cause: error });
    });
  }

  /** Model calls the scripted provider actually served (its ledger), across processes. */
  served(): number {
    if (!existsSync(this.ledger)) return 0;
    return readFileSync(this.ledger, "utf8").split("\n").filter((line) => line.trim()).length;
  }

  async close(): Promise<void> {
    await Promise.all(this.processes.map((proc) => proc.stop()));
    rmSync(this.dir, { recursive: true, force: true });
  }
}
