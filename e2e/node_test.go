package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// nodeJob is a job the Node.js worker trains in TestNodeWorker: its spec and each rank's gradient
// dtype.
type nodeJob struct {
	spec   job.Spec
	dtypes []wire.Dtype
}

// TestNodeWorker trains jobs with the Node.js worker of examples/node, written from
// docs/PROTOCOL.md alone, as OS processes against `fanin dev` (secured, as it is by default), with
// each job's credentials as a worker gets them: sgd from fanin's init, adam from parameters
// uploaded by rank 0, momentum with one rank's gradients in bf16, one in f16 and one in f32, and
// adamw with bf16 gradients and bf16 parameters. One sgd rank is SIGKILLed mid-run and started
// again, and resumes as the protocol's "After a crash" says. Every rank's final parameters must be
// byte-identical to fanin's single-process reference fed the same model's gradients, computed here
// in Go.
func TestNodeWorker(t *testing.T) {
	t.Parallel()
	skipShort(t)
	dir := nodeWorkerDir(t)
	data := t.TempDir()
	dev := start(t, "fanin dev", "dev", "--nats-port", "-1", "--http", "127.0.0.1:0", "--data-dir", data, "--log-level", "warn")
	api := dev.waitFor(t, regexpHTTP, 120*time.Second)
	url := dev.waitFor(t, regexp.MustCompile(`(?m)^\s+NATS\s+(nats://\S+)`), time.Second)
	token, err := os.ReadFile(filepath.Join(data, "auth", "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	admin := sdk.NewAdmin(api, sdk.WithToken(strings.TrimSpace(string(token))))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const steps = 40
	tensors := []job.Tensor{{Name: "w", Shape: []int{64, 40}}, {Name: "b", Shape: []int{40}}} // 4 shards of 4 KiB
	fn := func(name string, hyper map[string]float64) job.Function {
		return job.Function{Name: name, Hyper: hyper}
	}
	jobs := []nodeJob{
		{job.Spec{ID: "node-sgd", Ranks: 2, Function: fn("sgd", map[string]float64{"lr": 0.1, "weight_decay": 0.001}),
			Init: job.Init{Kind: "normal", Seed: 3, Scale: 0.1}}, []wire.Dtype{wire.F32, wire.F32}},
		{job.Spec{ID: "node-adam", Ranks: 2, Function: fn("adam", map[string]float64{"lr": 0.01}),
			Init: job.Init{Kind: "upload"}}, []wire.Dtype{wire.F32, wire.F32}},
		{job.Spec{ID: "node-momentum", Ranks: 3, Function: fn("momentum", map[string]float64{"lr": 0.05, "momentum": 0.9}),
			Init: job.Init{Kind: "uniform", Seed: 5, Scale: 0.05}}, []wire.Dtype{wire.BF16, wire.F16, wire.F32}},
		{job.Spec{ID: "node-adamw-bf16", Ranks: 2, Function: fn("adamw", map[string]float64{"lr": 0.01}),
			Init: job.Init{Kind: "upload"}, ParamDtype: wire.DtypeBF16}, []wire.Dtype{wire.BF16, wire.BF16}},
	}
	type worker struct {
		j    nodeJob
		rank int
		args []string
		out  string
		p    *proc
	}
	var workers []*worker
	for _, j := range jobs {
		j.spec.Tensors, j.spec.ShardSize = tensors, 4<<10
		created, err := admin.SubmitJob(ctx, j.spec)
		if err != nil {
			t.Fatalf("create %s: %v", j.spec.ID, err)
		}
		if created.Credentials == nil || created.Credentials.Creds == "" {
			t.Fatalf("%s: no NATS credentials: is fanin dev secured?", j.spec.ID)
		}
		creds := filepath.Join(dir, j.spec.ID+".creds")
		if err := os.WriteFile(creds, []byte(created.Credentials.Creds), 0o600); err != nil {
			t.Fatal(err)
		}
		for r, dt := range j.dtypes {
			w := &worker{j: j, rank: r, out: filepath.Join(dir, fmt.Sprintf("%s.%d.bin", j.spec.ID, r))}
			w.args = []string{filepath.Join(dir, "worker.mjs"), "--nats", url, "--creds", creds, "--job", j.spec.ID,
				"--rank", strconv.Itoa(r), "--steps", strconv.Itoa(steps), "--grad-dtype", dt.String(), "--out", w.out, "--every", "1"}
			workers = append(workers, w)
		}
	}
	for _, w := range workers {
		w.p = startBin(t, "node", fmt.Sprintf("node %s rank %d", w.j.spec.ID, w.rank), w.args...)
	}

	// SIGKILL rank 1 of the sgd job once it has finished step 7 (it is computing or publishing
	// step 8), then start it again with the same arguments.
	victim := workers[1]
	victim.p.waitFor(t, regexp.MustCompile(`step 7 loss`), 60*time.Second)
	victim.p.stop(syscall.SIGKILL)
	first := victim.p.output()
	victim.p = startBin(t, "node", "node node-sgd rank 1 (restarted)", victim.args...)
	resumed := victim.p.waitFor(t, regexp.MustCompile(`from step (\d+)`), 60*time.Second)
	t.Logf("node-sgd rank 1: SIGKILLed after %q, restarted, resumed from step %s", lastLine(first), resumed)

	for _, w := range workers {
		if err := w.p.wait(t, 2*time.Minute); err != nil {
			t.Fatalf("%s exited with %v:\n%s", w.p.name, err, w.p.output())
		}
	}
	for _, j := range jobs {
		rec, err := admin.Job(ctx, j.spec.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := f32bytes(nodeReference(t, rec, j.dtypes, steps))
		var done string
		for _, w := range workers {
			if w.j.spec.ID != j.spec.ID {
				continue
			}
			got, err := os.ReadFile(w.out)
			if err != nil {
				t.Fatalf("%s wrote no parameters: %v\n%s", w.p.name, err, w.p.output())
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: the final parameters differ from the reference's (%s)\n%s", w.p.name, firstDiff(got, want), w.p.output())
			}
			if w.rank == 0 {
				done = lastLine(w.p.output())
			}
		}
		paramDtype := j.spec.ParamDtype
		if paramDtype == "" {
			paramDtype = wire.DtypeF32
		}
		t.Logf("%s (%s, gradients %v, parameters %s): every rank byte-identical to the reference after %d steps (%s)",
			j.spec.ID, j.spec.Function.Name, j.dtypes, paramDtype, steps, done)
	}
}

// TestNodeDtypeRounding checks the Node.js worker's float32 to bf16 and f16 rounding (written
// from docs/PROTOCOL.md, "16-bit gradients") against the runtimes' own conversions: every 16-bit
// value's float32, the ties halfway to its neighbours and the float32s next to them, the edges
// the doc names, and a million random bit patterns (NaNs included).
func TestNodeDtypeRounding(t *testing.T) {
	t.Parallel()
	skipShort(t)
	dir := nodeWorkerDir(t)
	var in []uint32
	for h := range uint32(1 << 16) {
		bf := h << 16
		f16 := math.Float32bits(wire.F16ToF32(uint16(h)))
		for _, b := range []uint32{bf, bf | 0x8000, bf | 0x7fff, bf | 0x8001, f16, f16 + 0x1000, f16 + 0x0fff, f16 + 0x1001} {
			in = append(in, b)
		}
	}
	for _, f := range []float32{65504, 65519.996, 65520, 65536, 1.0 / (1 << 14), 1.0 / (1 << 24), 1.0 / (1 << 25), 1.5 / (1 << 25), 3.3961e38, math.MaxFloat32} {
		in = append(in, math.Float32bits(f), math.Float32bits(-f))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		in = append(in, rng.Uint32())
	}
	stdin := make([]byte, 4*len(in))
	for i, b := range in {
		binary.LittleEndian.PutUint32(stdin[4*i:], b)
	}
	out := nodeCheck(t, dir, "round", stdin)
	if len(out) != len(stdin) {
		t.Fatalf("node check.mjs round: %d bytes out for %d in", len(out), len(stdin))
	}
	bad := 0
	for i, b := range in {
		f := math.Float32frombits(b)
		gotBF, gotF16 := binary.LittleEndian.Uint16(out[4*i:]), binary.LittleEndian.Uint16(out[4*i+2:])
		if wantBF, wantF16 := wire.F32ToBF16(f), wire.F32ToF16(f); gotBF != wantBF || gotF16 != wantF16 {
			if bad++; bad <= 10 {
				t.Errorf("float32 %#08x (%g): node bf16 %#04x f16 %#04x, the runtimes' bf16 %#04x f16 %#04x", b, f, gotBF, gotF16, wantBF, wantF16)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d values rounded differently", bad, len(in))
	}
	t.Logf("%d float32 values round to the same bf16 and f16 in node as in the runtimes", len(in))
}

// TestNodeLayout checks the Node.js worker's layout, computed as docs/PROTOCOL.md section 1 says,
// against job.Spec.Layout on random specs: tensors of a few elements up to several shards' worth,
// shard sizes from 4 KiB, each spec valid.
func TestNodeLayout(t *testing.T) {
	t.Parallel()
	skipShort(t)
	dir := nodeWorkerDir(t)
	rng := rand.New(rand.NewPCG(3, 4))
	var specs []job.Spec
	for try := 0; len(specs) < 500; try++ {
		s := job.Spec{ID: fmt.Sprintf("l%d", len(specs)), Ranks: 1, ShardSize: job.ByteSize(4 * (1024 + rng.IntN(3*1024))),
			Function: job.Function{Name: "sum"}}
		target := int(s.ShardSize) / 4
		for i := range 1 + rng.IntN(8) {
			var shape []int
			switch rng.IntN(5) {
			case 0: // a few elements
				shape = []int{1 + rng.IntN(16)}
			case 4: // half a shard: two halves fill one exactly
				shape = []int{target/2 + rng.IntN(2)*(target%2)}
			case 1: // up to a shard
				shape = []int{1 + rng.IntN(target)}
			case 2: // exactly a shard, or one more
				shape = []int{target + rng.IntN(2)}
			default: // several shards, as a matrix
				shape = []int{1 + rng.IntN(64), 1 + rng.IntN(4*target/32+1)}
			}
			s.Tensors = append(s.Tensors, job.Tensor{Name: fmt.Sprintf("t%d", i), Shape: shape})
		}
		s.Normalize()
		switch err := s.Validate(); {
		case err == nil:
			specs = append(specs, s)
		case try > 2000:
			t.Fatalf("%d of %d random specs are invalid, the last: %v", try+1-len(specs), try+1, err)
		}
	}
	in, err := json.Marshal(specs)
	if err != nil {
		t.Fatal(err)
	}
	var got []job.Layout
	if err := json.Unmarshal(nodeCheck(t, dir, "layout", in), &got); err != nil || len(got) != len(specs) {
		t.Fatalf("node check.mjs layout: %v (%d layouts for %d specs)", err, len(got), len(specs))
	}
	shards := 0
	for i := range specs {
		want := specs[i].Layout()
		if !reflect.DeepEqual(got[i], want) {
			t.Fatalf("spec %+v: node's layout\n  %+v\nfanin's\n  %+v", specs[i], got[i], want)
		}
		shards += len(want.Shards)
	}
	t.Logf("%d specs (%d shards): node's layouts are fanin's", len(specs), shards)
}

// nodeCheck runs `node check.mjs what` in dir with stdin and returns its output.
func nodeCheck(t *testing.T, dir, what string, stdin []byte) []byte {
	t.Helper()
	cmd := exec.Command("node", filepath.Join(dir, "check.mjs"), what)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node check.mjs %s: %v\n%s", what, err, stderr.String())
	}
	return out
}

// nodeReference is fanin's reference for a job trained by examples/node's workers for steps steps:
// each rank's gradient of step t is nodeGradient at the parameters the workers held after step t-1
// (the bf16 rounding of the reference's, after step 0, with param_dtype bf16), rounded to the
// rank's dtype as it crossed the wire. It returns the parameters the workers hold at the end.
func nodeReference(t *testing.T, rec *job.Record, dtypes []wire.Dtype, steps int) []float32 {
	t.Helper()
	nin, nout := rec.Spec.Tensors[0].Shape[0], rec.Spec.Tensors[0].Shape[1]
	p0 := make([]float32, rec.Layout.Elements)
	if rec.Spec.Init.Kind == "upload" {
		for i := range p0 {
			p0[i] = nodeUnit(nodeHash(0xfeed, uint32(i), 0, 0)) / 16
		}
	} else {
		rec.Spec.InitShard(0, p0)
	}
	fn, err := rec.Spec.NewFunc()
	if err != nil {
		t.Fatal(err)
	}
	ref := functions.NewReference(fn, rec.Spec.Ranks, rec.Layout.Ranges(), p0)
	seen := append([]float32(nil), p0...)
	grads := make([][]float32, rec.Spec.Ranks)
	for r := range grads {
		grads[r] = make([]float32, len(p0))
	}
	for step := 1; step <= steps; step++ {
		for r, g := range grads {
			nodeGradient(g, seen, nin, nout, r, step)
			wire.Round(g, g, dtypes[r])
		}
		ref.Step(grads, nil)
		if rec.Spec.ParamDtype == wire.DtypeBF16 {
			wire.Round(seen, ref.Params(), wire.BF16)
		} else {
			copy(seen, ref.Params())
		}
	}
	return seen
}

// nodeHash, nodeUnit, nodeBatch and nodeGradient are examples/node/model.mjs in Go: the same
// integers, the same float32 operations in the same order (each product converted explicitly, so
// that no compiler fuses it into an FMA).
func nodeHash(a, b, c, d uint32) uint32 {
	h := uint32(0x811c9dc5)
	for _, v := range []uint32{a, b, c, d} {
		h = (h ^ v) * 0x01000193
	}
	h ^= h >> 15
	h *= 0x2c1b3c6d
	h ^= h >> 12
	return h
}

func nodeUnit(h uint32) float32 { return float32(int((h>>8)%129)-64) / 64 }

const nodeBatchSize = 8

func nodeBatch(nin, nout, rank, step int) (x, y []float32) {
	x, y = make([]float32, nodeBatchSize*nin), make([]float32, nodeBatchSize*nout)
	for s := range nodeBatchSize {
		for k := range nin {
			x[s*nin+k] = nodeUnit(nodeHash(uint32(rank), uint32(step), uint32(s), uint32(k)))
		}
		for o := range nout {
			acc := nodeUnit(nodeHash(0xb1a5, uint32(o), 0, 0)) / 4
			for k := range nin {
				acc = acc + float32(x[s*nin+k]*(nodeUnit(nodeHash(0x7e57, uint32(k), uint32(o), 0))/2))
			}
			y[s*nout+o] = acc
		}
	}
	return x, y
}

func nodeGradient(g, p []float32, nin, nout, rank, step int) {
	x, y := nodeBatch(nin, nout, rank, step)
	r := make([]float32, nodeBatchSize*nout)
	for s := range nodeBatchSize {
		for o := range nout {
			acc := p[nin*nout+o]
			for k := range nin {
				acc = acc + float32(x[s*nin+k]*p[k*nout+o])
			}
			r[s*nout+o] = acc - y[s*nout+o]
		}
	}
	inv := float32(1.0 / nodeBatchSize)
	for k := range nin {
		for o := range nout {
			var acc float32
			for s := range nodeBatchSize {
				acc = acc + float32(x[s*nin+k]*r[s*nout+o])
			}
			g[k*nout+o] = acc * inv
		}
	}
	for o := range nout {
		var acc float32
		for s := range nodeBatchSize {
			acc = acc + r[s*nout+o]
		}
		g[nin*nout+o] = acc * inv
	}
}

// nodeWorkerDir is a directory with examples/node's scripts and its dependencies, installed by
// `npm ci` from its package-lock.json (nodeModules). Outside CI the test is skipped without node
// and npm, or when npm cannot reach its registry and nothing is cached; in CI (.ci/run installs
// them) it fails.
func nodeWorkerDir(t *testing.T) string {
	t.Helper()
	needTool(t, "Debian: apt-get install nodejs npm", "node")
	needTool(t, "Debian: apt-get install npm", "npm")
	npm.once.Do(func() { npm.dir, npm.offline, npm.err = nodeModules() })
	switch {
	case npm.offline != "" && !inCI():
		t.Skip(npm.offline)
	case npm.offline != "":
		t.Fatal(npm.offline)
	case npm.err != nil:
		t.Fatal(npm.err)
	}
	dir := t.TempDir()
	scripts, err := filepath.Glob(filepath.Join(nodeSrc, "*.mjs"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in %s: %v", nodeSrc, err)
	}
	for _, f := range scripts {
		if err := copyFile(f, filepath.Join(dir, filepath.Base(f))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(npm.dir, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// nodeSrc is the Node.js worker's directory, from e2e/.
var nodeSrc = filepath.Join("..", "examples", "node")

// npm is nodeModules' answer, asked once per test process.
var npm struct {
	once    sync.Once
	dir     string // node_modules
	offline string // why npm could not install, when it could not reach its registry
	err     error
}

// nodeModules returns the node_modules directory that `npm ci` installs from examples/node's
// package.json and package-lock.json, cached in $FANIN_CACHE (~/.cache/fanin) under their hash, so
// that it runs once per lock file. offline says why, when npm could not reach its registry.
func nodeModules() (dir, offline string, err error) {
	h := sha256.New()
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(nodeSrc, f))
		if err != nil {
			return "", "", err
		}
		h.Write(b)
	}
	base := os.Getenv("FANIN_CACHE")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", "", err
		}
		base = filepath.Join(home, ".cache", "fanin")
	}
	cache := filepath.Join(base, "node", hex.EncodeToString(h.Sum(nil))[:16])
	dir = filepath.Join(cache, "node_modules")
	if _, err := os.Stat(filepath.Join(dir, "nats", "package.json")); err == nil {
		return dir, "", nil
	}
	if err := os.MkdirAll(filepath.Dir(cache), 0o755); err != nil {
		return "", "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(cache), "npm-ci-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(tmp)
	for _, f := range []string{"package.json", "package-lock.json"} {
		if err := copyFile(filepath.Join(nodeSrc, f), filepath.Join(tmp, f)); err != nil {
			return "", "", err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ci := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	ci.Dir = tmp
	if out, err := ci.CombinedOutput(); err != nil {
		head := firstLines(string(out), 4)
		if ctx.Err() != nil || regexp.MustCompile(`ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH`).MatchString(string(out)) {
			return "", fmt.Sprintf("npm ci could not reach the npm registry (offline?) and %s holds no install of examples/node's dependencies: %v\n%s", cache, err, head), nil
		}
		return "", "", fmt.Errorf("npm ci in a copy of %s: %v\n%s", nodeSrc, err, out)
	}
	if err := os.Rename(tmp, cache); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "nats", "package.json")); statErr != nil { // not another process's install
			return "", "", err
		}
	}
	return dir, "", nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

// firstLines is the first n lines of s.
func firstLines(s string, n int) string {
	lines := strings.SplitN(strings.TrimSpace(s), "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// firstDiff describes where two parameter vectors first differ.
func firstDiff(got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d bytes, want %d", len(got), len(want))
	}
	for i := 0; i+4 <= len(got); i += 4 {
		if g, w := binary.LittleEndian.Uint32(got[i:]), binary.LittleEndian.Uint32(want[i:]); g != w {
			return fmt.Sprintf("parameter %d is %g, want %g", i/4, math.Float32frombits(g), math.Float32frombits(w))
		}
	}
	return "same"
}

// lastLine is the last line of s.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}
