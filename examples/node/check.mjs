// Checks of fanin.mjs against fanin's own code, run by fanin's Go test (e2e/node_test.go):
//
//   node check.mjs round    reads float32 bit patterns (little-endian uint32) on stdin and writes,
//                           for each, its bfloat16 and its binary16 rounding (two little-endian
//                           uint16), as fanin.mjs sends gradients
//   node check.mjs layout   reads a JSON array of job specs on stdin and writes the JSON array of
//                           their layouts, computed as docs/PROTOCOL.md section 1 says
import { computeLayout, f32ToBF16, f32ToF16 } from "./fanin.mjs";

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const input = Buffer.concat(chunks);

switch (process.argv[2]) {
  case "round": {
    if (input.length % 4 !== 0) {
      console.error(`check round: ${input.length} bytes on stdin, not a whole number of float32s`);
      process.exit(2);
    }
    const out = Buffer.alloc(input.length);
    for (let i = 0; i < input.length; i += 4) {
      const b = input.readUInt32LE(i);
      out.writeUInt16LE(f32ToBF16(b), i);
      out.writeUInt16LE(f32ToF16(b), i + 2);
    }
    process.stdout.write(out);
    break;
  }
  case "layout":
    process.stdout.write(JSON.stringify(JSON.parse(input.toString("utf8")).map(computeLayout)));
    break;
  default:
    console.error("usage: node check.mjs round|layout < input");
    process.exit(2);
}
