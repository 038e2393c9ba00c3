// A fanin worker client in JavaScript, written from docs/PROTOCOL.md alone (the "nats" npm
// package is the NATS client). Section numbers below are the protocol doc's.
import { connect, credsAuthenticator, headers, nuid } from "nats";

const enc = new TextEncoder();
const dec = new TextDecoder();

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// A step or rank as the protocol writes it: canonical decimal, no sign, no leading zero.
function parseCanonical(s) {
  if (typeof s !== "string" || !/^(0|[1-9][0-9]{0,17})$/.test(s)) return null;
  return Number(s);
}

// ---- 16-bit floats (section 2, "16-bit gradients"; section 3, "16-bit parameters") ----

// f32ToBF16 rounds the float32 with bits b to bfloat16: nearest, ties to even; a value beyond
// bf16's largest finite one becomes Inf of its sign (the carry does it); a NaN becomes the quiet
// NaN of its sign, payload dropped.
export function f32ToBF16(b) {
  b >>>= 0;
  if ((b & 0x7fffffff) > 0x7f800000) return ((b >>> 16) & 0x8000) | 0x7fc0;
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

// f32ToF16 rounds the float32 with bits b to IEEE binary16: nearest, ties to even; |x| >= 65520
// to Inf of its sign; below 2^-14 to f16's subnormals, |x| <= 2^-25 to a signed zero; a NaN to
// the quiet NaN of its sign.
export function f32ToF16(b) {
  b >>>= 0;
  const sign = (b >>> 16) & 0x8000;
  const abs = b & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00;
  if (abs >= 0x477ff000) return sign | 0x7c00; // 65520, the tie above 65504, and beyond
  if (abs >= 0x38800000) {
    // a normal f16: rebias the exponent (127 - 15 = 112) and round off 13 mantissa bits
    const v = abs - 0x38000000;
    return sign | ((v + 0xfff + ((v >>> 13) & 1)) >>> 13);
  }
  const e = abs >>> 23;
  if (e < 102) return sign; // below 2^-25
  // a subnormal f16 is m x 2^-24; x = mant x 2^(e-150), so m = mant / 2^(126-e), rounded
  const mant = (abs & 0x7fffff) | 0x800000;
  const shift = 126 - e; // 14..24
  let m = mant >>> shift;
  const rem = mant - m * 2 ** shift;
  const half = 2 ** (shift - 1);
  if (rem > half || (rem === half && m & 1)) m++;
  return sign | m;
}

// encode writes a float32 vector as little-endian elements of dtype (f32, bf16 or f16).
export function encode(values, dtype) {
  const f = Float32Array.from(values);
  const bits = new Uint32Array(f.buffer);
  if (dtype === "f32") return littleEndian(new Uint8Array(f.buffer));
  const round = { bf16: f32ToBF16, f16: f32ToF16 }[dtype];
  if (!round) throw new Error(`unknown gradient dtype ${JSON.stringify(dtype)}: f32, bf16 or f16`);
  const out = new Uint8Array(2 * f.length);
  for (let i = 0; i < f.length; i++) {
    const h = round(bits[i]);
    out[2 * i] = h & 0xff;
    out[2 * i + 1] = h >>> 8;
  }
  return out;
}

// roundTo is what the runtimes see of values sent as dtype: each element rounded, widened back
// to float32 exactly.
export function roundTo(values, dtype) {
  if (dtype === "f32") return Float32Array.from(values);
  const wire = encode(values, dtype);
  const out = new Float32Array(values.length);
  const bits = new Uint32Array(out.buffer);
  for (let i = 0; i < out.length; i++) {
    const h = wire[2 * i] | (wire[2 * i + 1] << 8);
    bits[i] = dtype === "bf16" ? (h << 16) >>> 0 : f16Bits(h);
  }
  return out;
}

// f16Bits widens binary16 h to the bits of the same float32 (subnormals included).
function f16Bits(h) {
  const sign = (h & 0x8000) << 16;
  const e = (h >>> 10) & 0x1f;
  let m = h & 0x3ff;
  if (e === 0x1f) return (sign | 0x7f800000 | (m << 13)) >>> 0;
  if (e !== 0) return (sign | ((e + 112) << 23) | (m << 13)) >>> 0;
  if (m === 0) return sign >>> 0;
  let exp = 113; // normalise a subnormal: m x 2^-24
  while ((m & 0x400) === 0) {
    m <<= 1;
    exp--;
  }
  return (sign | (exp << 23) | ((m & 0x3ff) << 13)) >>> 0;
}

// decodeParams reads a parameters message by its own Fanin-Dtype (section 3): f32, or bf16 whose
// element h is the float32 with bits h << 16.
export function decodeParams(data, dtype, len) {
  const size = { f32: 4, bf16: 2 }[dtype];
  if (!size) throw new Error(`parameters of dtype ${JSON.stringify(dtype)}: want f32 or bf16`);
  if (data.length !== size * len) {
    throw new Error(`parameters of ${data.length} bytes, want ${len} ${dtype} elements (${size * len} bytes)`);
  }
  const out = new Float32Array(len);
  const bits = new Uint32Array(out.buffer);
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  for (let i = 0; i < len; i++) {
    bits[i] = size === 4 ? view.getUint32(4 * i, true) : (view.getUint16(2 * i, true) << 16) >>> 0;
  }
  return out;
}

// littleEndian returns the bytes of a Float32Array's buffer in little-endian order.
function littleEndian(bytes) {
  if (new Uint8Array(new Uint16Array([1]).buffer)[0] === 1) return bytes;
  const out = new Uint8Array(bytes.length);
  for (let i = 0; i < bytes.length; i += 4) {
    out[i] = bytes[i + 3];
    out[i + 1] = bytes[i + 2];
    out[i + 2] = bytes[i + 1];
    out[i + 3] = bytes[i];
  }
  return out;
}

// ---- the layout (section 1) ----

// parseSize reads shard_size as the record shows it (bytes), or as a spec may write it.
function parseSize(v) {
  if (v === undefined || v === null || v === 0 || v === "") return 1 << 20;
  if (typeof v === "number") return v;
  const m = /^\s*([0-9]+)\s*(B|KiB|MiB)?\s*$/.exec(v);
  if (!m) throw new Error(`shard_size ${JSON.stringify(v)}: want bytes, KiB or MiB`);
  return Number(m[1]) * { B: 1, KiB: 1024, MiB: 1 << 20 }[m[2] || "B"];
}

// computeLayout is the layout section 1 describes, computed from the spec.
export function computeLayout(spec) {
  const target = parseSize(spec.shard_size) / 4;
  const shards = [];
  let cur = null;
  let off = 0;
  const close = () => {
    if (cur) shards.push(cur);
    cur = null;
  };
  for (const t of spec.tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1);
    if (n <= target) {
      if (cur && cur.len + n > target) close();
      if (!cur) cur = { id: shards.length, off, len: 0, pieces: [] };
      cur.pieces.push({ tensor: t.name, off: 0, len: n });
      cur.len += n;
    } else {
      close();
      const parts = Math.ceil(n / target);
      for (let k = 0; k < parts; k++) {
        const lo = Math.floor((k * n) / parts);
        const hi = Math.floor(((k + 1) * n) / parts);
        shards.push({ id: shards.length, off: off + lo, len: hi - lo, pieces: [{ tensor: t.name, off: lo, len: hi - lo }] });
      }
    }
    off += n;
  }
  close();
  return { elements: off, shards };
}

// ---- errors ----

export class Rejected extends Error {
  constructor(report) {
    super(`fanin rejected ${report.job} shard ${report.shard} step ${report.step} rank ${report.rank}: ${report.reason}: ${report.detail}`);
    this.report = report;
  }
}

// ---- the client ----

export class Client {
  // connect (section 0): with the job's credentials (a .creds file's text) the connection's inbox
  // prefix must be the job's reply namespace, fanin.v1.<job>.inbox.
  static async connect(url, { job, creds } = {}) {
    const opts = { servers: url, name: `fanin-node-worker-${process.pid}`, maxReconnectAttempts: -1 };
    if (creds) {
      opts.authenticator = credsAuthenticator(enc.encode(creds));
      opts.inboxPrefix = `fanin.v1.${job}.inbox`;
    }
    const c = new Client();
    c.nc = await connect(opts);
    return c;
  }

  // request retries an answer of no responders (503) or a timeout for a few seconds (section 0:
  // 10 ms doubling to 0.5 s, for 5 s), then gives up naming what it asked.
  async request(subject, data, opts = {}, what = subject) {
    let wait = 10;
    const deadline = Date.now() + (opts.retryFor ?? 5000);
    for (;;) {
      try {
        return await this.nc.request(subject, data ?? new Uint8Array(), { timeout: opts.timeout ?? 5000, headers: opts.headers });
      } catch (e) {
        const retriable = e.code === "503" || e.code === "TIMEOUT";
        if (!retriable || Date.now() > deadline) {
          throw new Error(`${what}: ${e.code === "503" ? "no responders" : e.message}`, { cause: e });
        }
        await sleep(wait);
        wait = Math.min(2 * wait, 500);
      }
    }
  }

  // directGet is a JetStream direct get: the stored message, or null when there is none (404).
  async directGet(subject, body, what) {
    const m = await this.request(subject, body === undefined ? undefined : enc.encode(JSON.stringify(body)), {}, what);
    if (m.headers && (m.headers.code === 404 || m.headers.status === "404")) return null;
    if (m.headers && m.headers.code >= 400) throw new Error(`${what}: ${m.headers.code} ${m.headers.description}`);
    return m;
  }

  // job reads the job's record (section 1) and checks that its layout is the one the spec gives.
  async job(id) {
    const m = await this.directGet(`$JS.API.DIRECT.GET.KV_fanin-jobs.$KV.fanin-jobs.${id}`, undefined, `the record of job ${id}`);
    const op = m && m.headers && m.headers.get("KV-Operation");
    if (!m || op === "DEL" || op === "PURGE") throw new Error(`no job ${JSON.stringify(id)}`);
    const rec = JSON.parse(dec.decode(m.data));
    const mine = computeLayout(rec.spec);
    const same = mine.elements === rec.layout.elements && mine.shards.length === rec.layout.shards.length &&
      mine.shards.every((s, i) => {
        const r = rec.layout.shards[i];
        return s.id === r.id && s.off === r.off && s.len === r.len && JSON.stringify(s.pieces) === JSON.stringify(r.pieces);
      });
    if (!same) {
      throw new Error(`job ${id}: the layout computed from the spec differs from the record's:\n  mine   ${JSON.stringify(mine)}\n  record ${JSON.stringify(rec.layout)}`);
    }
    return rec;
  }

  async close() {
    await this.nc.drain();
  }
}

// jsPublish publishes with JetStream (a request whose answer is the acknowledgement) and follows
// section 2's table of refusals. It returns the acknowledgement, or {firstStands: true} when an
// upload of the shard is stored already.
async function jsPublish(client, subject, data, hdrs, what) {
  let full = 0;
  let wait = 10;
  for (;;) {
    const m = await client.request(subject, data, { headers: hdrs, retryFor: 30000 }, what);
    const ack = JSON.parse(dec.decode(m.data));
    const err = ack.error;
    if (!err) return ack;
    if (err.err_code === 10077 && /maximum messages per subject exceeded/.test(err.description)) return { firstStands: true };
    if (err.err_code === 10077 && full < 240) {
      full++; // the job's gradient stream is full: wait for the runtimes to purge it
    } else if ((err.code === 503 || err.code === 429) && err.err_code !== 10077) {
      // a stream electing its leader, or its ingest queue full
    } else {
      const reason = err.err_code === 10077 ? "quota_exceeded" : err.err_code === 10054 ? "oversized" : "refused";
      throw new Error(`${what}: ${reason}: JetStream error ${err.err_code} (${err.code}): ${err.description}`);
    }
    await sleep(wait);
    wait = Math.min(2 * wait, 250);
  }
}

// Worker is one logical rank of a bsp job.
export class Worker {
  constructor(client, rec, rank, { gradDtype = "f32", log = () => {} } = {}) {
    const spec = rec.spec;
    if (spec.sync && spec.sync !== "bsp") throw new Error(`job ${spec.id} is ${spec.sync}: this worker does bsp only`);
    if (!Number.isInteger(rank) || rank < 0 || rank >= spec.ranks) {
      throw new Error(`rank ${rank} is out of range: job ${spec.id} has ranks 0..${spec.ranks - 1}`);
    }
    if (!["f32", "bf16", "f16"].includes(gradDtype)) throw new Error(`gradient dtype ${JSON.stringify(gradDtype)}: f32, bf16 or f16`);
    Object.assign(this, { client, rec, rank, gradDtype, log, id: spec.id });
    this.shards = rec.layout.shards;
    this.params = new Float32Array(rec.layout.elements);
    this.step = -1; // the step of this.params, -1 before any
    this.latest = new Map(); // shard -> {step, data}: the newest parameters pushed, or read by start
    this.waiters = [];
    this.rejects = [];
    this.firstWaits = []; // ms from publishing to a step's first parameters, recent steps
    this.reconnected = false;
  }

  subject(kind, shard) {
    return `fanin.v1.${this.id}.${kind}.${shard}`;
  }

  // open subscribes to the pushed parameters (before any gradient is published) and to this
  // worker's rejection reports.
  open() {
    const nc = this.client.nc;
    (async () => {
      for await (const st of nc.status()) {
        if (st.type === "reconnect") {
          this.reconnected = true;
          this.wake();
        }
      }
    })().catch(() => {});
    this.paramsSub = nc.subscribe(`fanin.v1.${this.id}.params.*`, {
      callback: (err, m) => {
        if (err) return;
        // a notification from the job's account: check it, ignore anything odd (section 3)
        const shard = parseCanonical(m.subject.slice(m.subject.lastIndexOf(".") + 1));
        const s = shard === null ? undefined : this.shards[shard];
        const step = m.headers && parseCanonical(m.headers.get("Fanin-Step"));
        if (!s || step === null || step === undefined) return;
        let data;
        try {
          data = decodeParams(m.data, m.headers.get("Fanin-Dtype"), s.len);
        } catch {
          return;
        }
        const have = this.latest.get(shard);
        if (!have || step > have.step) this.latest.set(shard, { step, data });
        this.wake();
      },
    });
    this.replyTo = `fanin.v1.${this.id}.inbox.rank${this.rank}.${nuid.next()}`;
    this.rejectSub = nc.subscribe(this.replyTo, {
      callback: (err, m) => {
        if (err) return;
        try {
          this.rejects.push(JSON.parse(dec.decode(m.data)));
        } catch {
          return;
        }
        this.wake();
      },
    });
  }

  wake() {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  // changed resolves at the next push or report, or after ms.
  changed(ms) {
    return new Promise((resolve) => {
      const t = setTimeout(resolve, ms);
      this.waiters.push(() => {
        clearTimeout(t);
        resolve();
      });
    });
  }

  // fetch reads a shard's newest parameters from the stream (section 3); with older, the older
  // of the two versions the stream keeps. null: nothing stored yet.
  async fetch(shard, older = false) {
    const subj = this.subject("params", shard);
    const m = older
      ? await this.client.directGet(`$JS.API.DIRECT.GET.FANIN_PARAMS_${this.id}`, { next_by_subj: subj }, `the older parameters of shard ${shard}`)
      : await this.client.directGet(`$JS.API.DIRECT.GET.FANIN_PARAMS_${this.id}.${subj}`, undefined, `the parameters of shard ${shard}`);
    if (!m) return null;
    const step = parseCanonical(m.headers.get("Fanin-Step"));
    if (step === null) throw new Error(`shard ${shard}: stored parameters with Fanin-Step ${JSON.stringify(m.headers.get("Fanin-Step"))}`);
    return { step, data: decodeParams(m.data, m.headers.get("Fanin-Dtype"), this.shards[shard].len) };
  }

  // upload publishes the initial parameters of an init `upload` job (section 3). A shard whose
  // upload is stored already keeps it.
  async upload(values) {
    if (values.length !== this.rec.layout.elements) throw new Error(`upload of ${values.length} values: job ${this.id} has ${this.rec.layout.elements}`);
    for (const s of this.shards) {
      const h = headers();
      h.set("Fanin-Step", "0");
      h.set("Fanin-Dtype", "f32");
      h.set("Nats-Msg-Id", `${this.id}.i.${s.id}`);
      h.set("Fanin-Reply-To", this.replyTo);
      await jsPublish(this.client, this.subject("init", s.id), encode(values.subarray(s.off, s.off + s.len), "f32"), h, `upload of shard ${s.id}`);
    }
  }

  // start loads parameters of one step for every shard (section 3, "After a crash"): the lowest
  // step t among the newest, and for shards already at t+1 the older version, which must be t.
  // It waits for step 0 while nothing is stored (an upload job before its upload).
  async start(timeoutMs = 120000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const got = await Promise.all(this.shards.map((s) => this.fetch(s.id)));
      if (got.some((g) => g === null)) {
        if (Date.now() > deadline) throw new Error(`job ${this.id}: no step-0 parameters after ${timeoutMs / 1000} s`);
        await sleep(100);
        continue;
      }
      const t = Math.min(...got.map((g) => g.step));
      if (Math.max(...got.map((g) => g.step)) > t + 1) continue; // the job moved on while we read
      let ok = true;
      for (const s of this.shards) {
        let g = got[s.id];
        if (g.step === t + 1) {
          // step t+1 is applied already: no push will bring it again, so keep it for stepWith
          this.latest.set(s.id, g);
          g = await this.fetch(s.id, true);
          if (!g || g.step !== t) {
            ok = false;
            break;
          }
        }
        this.params.set(g.data, s.off);
      }
      if (ok) {
        this.step = t;
        return t;
      }
    }
  }

  // publish sends this rank's gradient for step t, every shard (section 2).
  async publish(t, grad) {
    await Promise.all(this.shards.map(async (s) => {
      const h = headers();
      h.set("Fanin-Step", String(t));
      h.set("Fanin-Rank", String(this.rank));
      h.set("Fanin-Dtype", this.gradDtype);
      h.set("Nats-Msg-Id", `${this.id}.g.${s.id}.${t}.${this.rank}`);
      h.set("Fanin-Reply-To", this.replyTo);
      await jsPublish(this.client, this.subject("grad", s.id), encode(grad.subarray(s.off, s.off + s.len), this.gradDtype), h,
        `step ${t} shard ${s.id}`);
    }));
  }

  // stepWith publishes grad (computed from this.params, at step t-1) as step t's and waits for
  // step t's parameters of every shard. It fetches from the stream only what is missing, not
  // merely late (section 3): at once after a reconnect; when the step's pushes, once begun, stop
  // for 1 s; or when none has come for twice the longest recent wait for a first push (1 to 10 s).
  async stepWith(grad, timeoutMs = 300000) {
    if (grad.length !== this.params.length) throw new Error(`a gradient of ${grad.length} values: job ${this.id} has ${this.params.length}`);
    const t = this.step + 1;
    this.reconnected = false;
    await this.publish(t, grad);
    const missing = new Set(this.shards.map((s) => s.id));
    const start = Date.now();
    const deadline = start + timeoutMs;
    const firstWait = Math.min(10000, Math.max(1000, 2 * Math.max(0, ...this.firstWaits)));
    let firstAt = null; // when the step's first parameters came
    let lastProgress = start;
    while (missing.size > 0) {
      for (const r of this.rejects.splice(0)) {
        if (r.step !== t) continue; // a late report of an earlier step
        if (r.reason !== "stale_step") throw new Rejected(r);
        // step t is applied already (a re-sent step after a restart): take it from the stream
        const g = await this.fetch(r.shard);
        if (g && g.step >= t) this.latest.set(r.shard, g);
      }
      for (const shard of [...missing]) {
        const g = this.latest.get(shard);
        if (!g || g.step < t) continue;
        if (g.step > t) throw new Error(`shard ${shard} is at step ${g.step} while rank ${this.rank} waits for step ${t}: in bsp it cannot be`);
        this.params.set(g.data, this.shards[shard].off);
        missing.delete(shard);
        lastProgress = Date.now();
        if (firstAt === null) {
          firstAt = lastProgress;
          this.firstWaits = [...this.firstWaits.slice(-15), firstAt - start];
        }
      }
      if (missing.size === 0) break;
      const now = Date.now();
      if (now > deadline) throw new Error(`step ${t}: no parameters of shards ${[...missing].join(", ")} after ${timeoutMs / 1000} s`);
      const stalled = firstAt === null ? now - lastProgress >= firstWait : now - lastProgress >= 1000;
      if (this.reconnected || stalled) {
        // the stream is the authority: pushes sent while we were away are lost
        this.reconnected = false;
        for (const shard of missing) {
          const g = await this.fetch(shard);
          const have = this.latest.get(shard);
          if (g && (!have || g.step > have.step)) this.latest.set(shard, g);
        }
        lastProgress = Date.now();
        continue;
      }
      await this.changed(250);
    }
    this.step = t;
    return this.params;
  }

  async close() {
    this.paramsSub?.unsubscribe();
    this.rejectSub?.unsubscribe();
  }
}
