/**
 * The package stays in lockstep with the Python distribution and with the API's contract:
 * its version is the Python distribution's, `openapi.json` is the document the API serves
 * now, and `src/generated/openapi.ts` is what openapi-typescript makes of it. Refresh
 * both with `python -m tests.client_ts.openapi` (from the repository root, PYTHONPATH=src).
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { test } from "node:test";

import { VERSION } from "@toren-run/client";

import { PACKAGE, REPO, pythonEnv } from "./harness.js";

const REFRESH = "refresh it with `PYTHONPATH=src python -m tests.client_ts.openapi` from the repository root";

function python(code: string): string {
  const result = spawnSync(process.env["TOREN_PYTHON"] ?? "python3", ["-c", code], {
    cwd: REPO,
    env: pythonEnv({ PYTHONPATH: [join(REPO, "src"), REPO].join(delimiter) }),
    encoding: "utf8",
  });
  assert.equal(result.status, 0, result.stderr);
  return result.stdout;
}

test("the package's version is the Python distribution's (pyproject and toren.__version__)", () => {
  const pkg = JSON.parse(readFileSync(join(PACKAGE, "package.json"), "utf8")) as { version: string };
  const lock = JSON.parse(readFileSync(join(PACKAGE, "package-lock.json"), "utf8")) as { version: string };
  const pyproject = readFileSync(join(REPO, "pyproject.toml"), "utf8");
  const project = /^\[project\]\n(?:(?!^\[).*\n)*?^version\s*=\s*"([^"]+)"/m.exec(pyproject);
  assert.ok(project, "pyproject.toml has [project] version");
  const init = readFileSync(join(REPO, "src", "toren", "__init__.py"), "utf8");
  const runtime = /^__version__ = "([^"]+)"$/m.exec(init)?.[1];
  assert.deepEqual(
    { package: pkg.version, lockfile: lock.version, exported: VERSION, runtime },
    { package: project[1], lockfile: project[1], exported: project[1], runtime: project[1] },
    "@toren-run/client releases in lockstep with toren-run: the versions must be equal",
  );
});

test("openapi.json is the document the API serves now", () => {
  const current = python(
    "import sys; from tests.client_ts.openapi import current_document, render; " +
      "sys.stdout.write(render(current_document()))",
  );
  const committed = readFileSync(join(PACKAGE, "openapi.json"), "utf8");
  assert.ok(current === committed, `clients/typescript/openapi.json is stale; ${REFRESH}`);
});

test("src/generated/openapi.ts is openapi-typescript's output for openapi.json", () => {
  const dir = mkdtempSync(join(tmpdir(), "toren-openapi-"));
  try {
    const output = join(dir, "openapi.ts");
    const result = spawnSync(
      join(PACKAGE, "node_modules", ".bin", "openapi-typescript"),
      [join(PACKAGE, "openapi.json"), "--output", output],
      { cwd: PACKAGE, encoding: "utf8" },
    );
    assert.equal(result.status, 0, result.stderr);
    const generated = readFileSync(output, "utf8");
    const committed = readFileSync(join(PACKAGE, "src", "generated", "openapi.ts"), "utf8");
    assert.ok(generated === committed, `src/generated/openapi.ts is stale; ${REFRESH}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("every TypeScript example of the docs is an example file, which the type-check covers", () => {
  const examples = readdirSync(join(PACKAGE, "examples"))
    .filter((name) => name.endsWith(".ts"))
    .map((name) => readFileSync(join(PACKAGE, "examples", name), "utf8"));
  const docs = [join(REPO, "README.md"), join(REPO, "docs", "http-api.md"), join(PACKAGE, "README.md")];
  let blocks = 0;
  for (const doc of docs) {
    for (const [, block] of readFileSync(doc, "utf8").matchAll(/^```ts\n([\s\S]*?)^```$/gm)) {
      blocks += 1;
      assert.ok(
        examples.some((example) => example.includes(block!)),
        `this TypeScript block of ${doc} is in no file of clients/typescript/examples:\n${block}`,
      );
    }
  }
  assert.ok(blocks >= 3, `found ${blocks} TypeScript blocks`);
});
