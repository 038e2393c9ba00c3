// A tiny least-squares model, y = x W + b, trained on a synthetic data set that every process
// generates alike. Every gradient is a function of (rank, step, parameters) only, computed in
// float32 (Math.fround after every operation, in a fixed order), so a run can be replayed
// anywhere bit for bit: fanin's Go test replays it against fanin's reference (e2e/node_test.go).

export const BATCH = 8;

// hash mixes four integers into 32 bits (FNV-1a over them, then a murmur-style finaliser).
export function hash(a, b, c, d) {
  let h = 0x811c9dc5;
  for (const v of [a, b, c, d]) h = Math.imul(h ^ v, 0x01000193) >>> 0;
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d) >>> 0;
  h ^= h >>> 12;
  return h >>> 0;
}

// unit is a value of [-1, 1] in steps of 1/64 (exact in float32).
export function unit(h) {
  return (((h >>> 8) % 129) - 64) / 64;
}

// shapes reads the model's sizes from the job's tensors: w [in, out] and b [out], in that order.
export function shapes(spec) {
  const [w, b] = spec.tensors;
  if (spec.tensors.length !== 2 || w.name !== "w" || b.name !== "b" || w.shape.length !== 2 || b.shape.length !== 1 || b.shape[0] !== w.shape[1]) {
    throw new Error(`job ${spec.id}: the model needs tensors w [in, out] and b [out], got ${JSON.stringify(spec.tensors)}`);
  }
  return { nin: w.shape[0], nout: w.shape[1] };
}

// initial is the parameters a job created with init `upload` starts from.
export function initial({ nin, nout }) {
  const p = new Float32Array(nin * nout + nout);
  for (let i = 0; i < p.length; i++) p[i] = unit(hash(0xfeed, i, 0, 0)) / 16;
  return p;
}

// batch is rank's batch of step: BATCH samples x [nin], their targets y [nout] from a fixed true
// model (W*[k][o] = unit/2, b*[o] = unit/4).
export function batch({ nin, nout }, rank, step) {
  const x = new Float32Array(BATCH * nin);
  const y = new Float32Array(BATCH * nout);
  for (let s = 0; s < BATCH; s++) {
    for (let k = 0; k < nin; k++) x[s * nin + k] = unit(hash(rank, step, s, k));
    for (let o = 0; o < nout; o++) {
      let acc = Math.fround(unit(hash(0xb1a5, o, 0, 0)) / 4);
      for (let k = 0; k < nin; k++) acc = Math.fround(acc + Math.fround(x[s * nin + k] * Math.fround(unit(hash(0x7e57, k, o, 0)) / 2)));
      y[s * nout + o] = acc;
    }
  }
  return { x, y };
}

// gradient writes into g the gradient of the mean over the batch of 0.5 |x W + b - y|^2 at
// params (W row-major, then b), and returns the loss (float64, for display).
export function gradient(g, params, dims, rank, step) {
  const { nin, nout } = dims;
  const { x, y } = batch(dims, rank, step);
  const r = new Float32Array(BATCH * nout);
  let loss = 0;
  for (let s = 0; s < BATCH; s++) {
    for (let o = 0; o < nout; o++) {
      let acc = params[nin * nout + o];
      for (let k = 0; k < nin; k++) acc = Math.fround(acc + Math.fround(x[s * nin + k] * params[k * nout + o]));
      r[s * nout + o] = Math.fround(acc - y[s * nout + o]);
      loss += 0.5 * r[s * nout + o] * r[s * nout + o];
    }
  }
  const inv = Math.fround(1 / BATCH);
  for (let k = 0; k < nin; k++) {
    for (let o = 0; o < nout; o++) {
      let acc = 0;
      for (let s = 0; s < BATCH; s++) acc = Math.fround(acc + Math.fround(x[s * nin + k] * r[s * nout + o]));
      g[k * nout + o] = Math.fround(acc * inv);
    }
  }
  for (let o = 0; o < nout; o++) {
    let acc = 0;
    for (let s = 0; s < BATCH; s++) acc = Math.fround(acc + r[s * nout + o]);
    g[nin * nout + o] = Math.fround(acc * inv);
  }
  return loss / BATCH;
}
