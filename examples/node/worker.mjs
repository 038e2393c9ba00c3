#!/usr/bin/env node
// A fanin worker in Node.js: trains one logical rank of a bsp job through fanin, the least-squares
// model of model.mjs, speaking docs/PROTOCOL.md over the "nats" npm package.
//
//   node worker.mjs --job ID --rank R --steps N [--nats URL] [--creds FILE] [--grad-dtype f32|bf16|f16] [--out FILE]
//
// --creds is the job's .creds file (`fanin jobs create -f spec.yaml --creds-dir .` writes ID.creds);
// without it the worker connects without credentials (fanin dev --no-auth). Rank 0 of a job with
// init `upload` uploads the initial parameters. --out writes the final parameters, little-endian
// float32. A worker restarted with the same arguments continues where the job is.
import { readFileSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { Client, Worker, encode } from "./fanin.mjs";
import { gradient, initial, shapes } from "./model.mjs";

const usage = "usage: node worker.mjs --job ID --rank R --steps N [--nats URL] [--creds FILE] [--grad-dtype f32|bf16|f16] [--out FILE] [--every K]";

function fail(msg) {
  console.error(`worker: ${msg}`);
  process.exit(2);
}

function intArg(v, name, min) {
  if (v === undefined) fail(`--${name} is required\n${usage}`);
  if (!/^[0-9]+$/.test(v) || Number(v) < min) fail(`--${name} ${JSON.stringify(v)}: want an integer >= ${min}`);
  return Number(v);
}

let args;
try {
  ({ values: args } = parseArgs({
    options: {
      nats: { type: "string", default: "nats://127.0.0.1:4222" },
      creds: { type: "string" },
      job: { type: "string" },
      rank: { type: "string" },
      steps: { type: "string" },
      "grad-dtype": { type: "string", default: "f32" },
      out: { type: "string" },
      every: { type: "string", default: "10" },
    },
  }));
} catch (e) {
  fail(`${e.message}\n${usage}`);
}
if (!args.job) fail(`--job is required\n${usage}`);
const rank = intArg(args.rank, "rank", 0);
const steps = intArg(args.steps, "steps", 1);
const every = intArg(args.every, "every", 1);
const tag = `${args.job} rank ${rank}`;
const log = (line) => console.log(`${tag}: ${line}`);

let creds;
if (args.creds) {
  try {
    creds = readFileSync(args.creds, "utf8");
  } catch (e) {
    fail(`--creds: ${e.message}`);
  }
}

const client = await Client.connect(args.nats, { job: args.job, creds });
try {
  const rec = await client.job(args.job);
  const dims = shapes(rec.spec);
  const w = new Worker(client, rec, rank, { gradDtype: args["grad-dtype"] });
  w.open();
  if (rank === 0 && rec.spec.init && rec.spec.init.kind === "upload") {
    await w.upload(initial(dims));
    log("uploaded the initial parameters");
  }
  const from = await w.start();
  log(`${rec.layout.shards.length} shards, ${rec.layout.elements} parameters, ${rec.spec.function.name}, from step ${from}`);
  const g = new Float32Array(rec.layout.elements);
  let first;
  let loss;
  while (w.step < steps) {
    const t = w.step + 1;
    loss = gradient(g, w.params, dims, rank, t);
    first ??= loss;
    await w.stepWith(g);
    if (t % every === 0 || t === steps) log(`step ${t} loss ${loss.toFixed(6)}`);
  }
  if (args.out) writeFileSync(args.out, encode(w.params, "f32"));
  log(`done: step ${w.step}, loss ${first?.toFixed(6)} -> ${loss?.toFixed(6)}`);
  await w.close();
} catch (e) {
  console.error(`worker: ${tag}: ${e.message}`);
  process.exitCode = 1;
} finally {
  await client.close();
}
